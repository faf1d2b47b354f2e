"""Load an export dir's ONNX graphs into ORT sessions that share ONE copy of the weights.

Needs only numpy and onnxruntime (no torch, no onnx): what the service imports. The graphs refer to
`onnx/weights.bin` as external data; loading each by path would make every session read its own
copy. Instead the file is memory-mapped once, every tensor of the manifest's weight table becomes
one `OrtValue` over that mapping (no copy), and each bucket's session gets the same OrtValues via
`SessionOptions.add_initializer`. ORT uses a user-supplied initializer in place, so the weights are
resident once for all buckets (and, being file-backed, shared by worker processes through the page
cache). A server passes `in_memory_weights=True`: the file is read into private memory once instead
(the same resident size, since warm-up touches every page anyway), and only the tensors of the graphs it loads
(`map_weights` with `names`, `graph_weights`: served int8, none of the products' fp32 weights), so a weights file overwritten or
truncated under the running process changes nothing: a mapping would serve the new bytes unchecked,
or die of SIGBUS on a page past the new end. Session options are the manifest's (optimisation off: the graphs are optimised offline;
MLAS pre-packing off: it would give each session a packed copy of every MatMul weight).

Activations: by default every ORT session owns a CPU arena that grows to the largest run it has
seen and never shrinks, and its memory pattern pre-plans one block per input shape. A server with
one session per bucket per model, each warmed up at its largest batch, then holds the sum of every
session's peak: 5.4 GB for the two default models. `shared_arena=True` (what a server passes)
registers ONE arena for the whole process (`session.use_env_allocators`) and turns the memory
pattern off, so tensors are taken and given back one by one: the process holds about the peak of
the runs that happen at once (0.7 GB for the same two models; bench/memory.py measures both).

    sessions = load_sessions("export_dir")            # {128: InferenceSession, 256: …}
    logits, embeddings = sessions[128].run(None, feeds)
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort

from .manifest import Manifest, read_manifest
from .precisions import FP32_GRAPHS


@dataclass
class MappedWeights:
    """The weights file, mapped (or read into memory) once, and one OrtValue per tensor over it."""

    # np.memmap, or the file's bytes in private memory (in_memory); None: a buffer per tensor (in_memory with names)
    mapping: np.ndarray | None
    values: dict[str, ort.OrtValue]
    arrays: dict[str, np.ndarray]  # the numpy views the OrtValues wrap (kept alive with them)

    def drop(self, names: Iterable[str]) -> None:
        """Let go of tensors no graph still loaded reads (their memory is freed where each has a buffer of its own,
        `map_weights` with `names`): int8-openvino's products, once made int8 (service/runtimes `load_runtime`)."""
        for name in names:
            self.values.pop(name, None)
            self.arrays.pop(name, None)


def onnx_section(export_dir: str | Path, manifest: Manifest):
    if manifest.onnx is None:
        raise ValueError(f"{export_dir} has no ONNX graphs (export with --formats onnx)")
    return manifest.onnx


def map_weights(
    export_dir: str | Path,
    manifest: Manifest | None = None,
    in_memory: bool = False,
    names: Iterable[str] | None = None,
) -> MappedWeights:
    """Memory-map `onnx/weights.bin` (or, `in_memory`, read it into private memory) and wrap each
    tensor of the manifest's table in an OrtValue. `names`: only those tensors (the graphs a server
    loads, `graph_weights`), the rest neither read nor wrapped; None: every tensor."""
    export_dir = Path(export_dir)
    section = onnx_section(export_dir, manifest or read_manifest(export_dir))
    path = export_dir / section.weights_file
    table = section.weights if names is None else {name: section.weights[name] for name in sorted(set(names))}
    if in_memory and names is not None:
        mapping, buffers = None, _read_tensors(path, table)
    else:
        # in memory: one read, nothing refers to the file afterwards; else copy-on-write: pages stay
        # shared with the page cache (and other processes) unless written
        mapping = np.fromfile(path, dtype=np.uint8) if in_memory else np.memmap(path, dtype=np.uint8, mode="c")
        buffers = {name: mapping[t.offset : t.offset + t.length] for name, t in table.items()}
    arrays, values = {}, {}
    for name, t in table.items():
        arrays[name] = buffers[name].view(np.dtype(t.dtype)).reshape(t.shape)
        values[name] = ort.OrtValue.ortvalue_from_numpy(arrays[name])
    return MappedWeights(mapping, values, arrays)


# Where `_read_tensors` places each tensor: at an address that is a multiple of this (a cache line, the alignment
# the weights file itself keeps), so every tensor is aligned as its kernels expect
_ALIGNMENT = 64


def _read_tensors(path: Path, table: dict) -> dict[str, np.ndarray]:
    """The bytes of each tensor of `table` read from the weights file `path` into a buffer of its own, aligned:
    one buffer per tensor, so that a tensor the server stops needing can be let go (`MappedWeights.drop`)."""
    buffers = {}
    with open(path, "rb") as file:
        for name, t in table.items():
            raw = np.empty(t.length + _ALIGNMENT, dtype=np.uint8)
            start = -raw.ctypes.data % _ALIGNMENT
            buffers[name] = raw[start : start + t.length]
            file.seek(t.offset)
            if file.readinto(memoryview(buffers[name])) != t.length:
                raise ValueError(f"{path} ends inside tensor {name!r}: the file is not the one the manifest describes")
    return buffers


def graph_weights(manifest: Manifest, graphs: Iterable[tuple[int, str]]) -> set[str]:
    """The weights the graphs (bucket, variant) of `manifest` read from the shared file: what a server that
    loads only those graphs needs in memory (fp32 graphs served int8 need none of their fp32 products)."""
    return {name for bucket, variant in graphs for name in manifest.onnx.graph(bucket, variant).shared_initializers}


_PROCESS_ARENA_REGISTERED = False


def register_process_arena() -> None:
    """One CPU arena for every session of this process that opts in (`session.use_env_allocators`);
    idempotent. The arena grows by powers of two, like a session's own."""
    global _PROCESS_ARENA_REGISTERED
    if _PROCESS_ARENA_REGISTERED:
        return
    cpu = ort.OrtMemoryInfo("Cpu", ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0, ort.OrtMemType.DEFAULT)
    # OrtArenaCfg(max_mem, arena_extend_strategy, initial_chunk_size_bytes, max_dead_bytes_per_chunk):
    # no cap, next power of two, ORT's default chunk sizes
    ort.create_and_register_allocator(cpu, ort.OrtArenaCfg(0, 0, -1, -1))
    _PROCESS_ARENA_REGISTERED = True


def session_options(
    manifest: Manifest,
    intra_op_threads: int | None = None,
    spin_wait: bool | None = None,
    shared_arena: bool = False,
) -> ort.SessionOptions:
    """The session options the export was made for (the manifest's onnx.session_options).

    `spin_wait=False` stops ORT's intra-op threads from spinning after each run (ORT spins by
    default). A server runs several sessions at once (a short and a long lane) next to its own
    Python threads; spinning threads then take the cores the others need.

    `shared_arena=True`: activations come from the one process-wide arena, tensor by tensor (no
    memory pattern), not from an arena of the session's own (see the module docstring)."""
    spec = manifest.onnx.session_options
    options = ort.SessionOptions()
    options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, spec.graph_optimization_level)
    for key, value in spec.config_entries.items():
        options.add_session_config_entry(key, value)
    if intra_op_threads:
        options.intra_op_num_threads = intra_op_threads
    if spin_wait is not None:
        options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin_wait else "0")
    if shared_arena:
        register_process_arena()
        options.add_session_config_entry("session.use_env_allocators", "1")
        options.enable_mem_pattern = False
    return options


def load_sessions(
    export_dir: str | Path,
    buckets: list[int] | None = None,
    variant: str = FP32_GRAPHS,
    intra_op_threads: int | None = None,
    shared: MappedWeights | None = None,
    providers: list[str] | None = None,
    spin_wait: bool | None = None,
    manifest: Manifest | None = None,
    in_memory_weights: bool = False,
    shared_arena: bool = False,
) -> dict[int, ort.InferenceSession]:
    """{bucket: InferenceSession} for the export dir's ONNX graphs, all over one copy of the weights.

    `variant` is "fp32" or "int8" (when exported with --quantize int8). Pass `shared` (from
    `map_weights`) to reuse a mapping across calls; each session keeps a reference to it. Pass the
    `manifest` when it has been read already (it is read from the dir otherwise).
    `in_memory_weights`: read the weights into private memory rather than map the file (a server).
    `shared_arena`: activations from the one process-wide arena (a server; see `session_options`).
    """
    export_dir = Path(export_dir)
    manifest = manifest or read_manifest(export_dir)
    section = onnx_section(export_dir, manifest)
    shared = shared or map_weights(export_dir, manifest, in_memory=in_memory_weights)
    sessions = {}
    for bucket in sorted(section.buckets):
        if buckets is not None and bucket not in buckets:
            continue
        entry = section.graph(bucket, variant)
        options = session_options(manifest, intra_op_threads, spin_wait, shared_arena)
        for name in entry.shared_initializers:
            options.add_initializer(name, shared.values[name])
        session = ort.InferenceSession(
            str(export_dir / entry.file), options, providers=providers or ["CPUExecutionProvider"]
        )
        session.bigs_shared_weights = shared  # the OrtValues must outlive the session
        sessions[bucket] = session
    return sessions
