"""A finished graph: its weights moved into the one shared weights file, checked and saved.

Every initializer of at least `MIN_SHARED_BYTES` is moved into `onnx/weights.bin`, deduplicated by content
across buckets and variants, renamed to one name per content ("shared/…") and aligned (64 bytes; a page from
1 MiB). Each `onnx/<bucket>.onnx` is small and refers to it as ONNX external data, so the dir loads with any
ONNX tool; `export/onnx_runtime.py` instead maps the file once and hands the same buffers to every bucket's
session (`SessionOptions.add_initializer`), so the weights are in memory once.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

WEIGHTS_FILE = "weights.bin"
MIN_SHARED_BYTES = 1024  # smaller initializers stay inside each graph
ALIGN = 64  # every tensor starts 64-byte aligned (SIMD loads straight from the mapped file)
PAGE = 4096  # tensors of PAGE_ALIGN_BYTES or more start on a page (ORT may memory-map those itself)
PAGE_ALIGN_BYTES = 1 << 20


@dataclass
class WeightsFileWriter:
    """Initializers moved out of the graphs into one file, one copy per distinct content."""

    path: Path
    tensors: dict[str, dict] = field(default_factory=dict)  # name → {dtype, shape, offset, length}
    _by_content: dict[str, str] = field(default_factory=dict)  # content hash → name

    def __post_init__(self):
        self.path.write_bytes(b"")

    def add(self, name: str, array: np.ndarray) -> str:
        """Store `array` (once per content); returns its canonical name."""
        array = np.ascontiguousarray(array)
        digest = hashlib.sha256(f"{array.dtype.str}{array.shape}".encode() + array.tobytes()).hexdigest()
        if digest in self._by_content:
            return self._by_content[digest]
        # Own namespace: a shared name never collides with a name the exporter gave something else.
        canonical = f"shared/{name}"
        if canonical in self.tensors:  # same name, other content (e.g. an SSM constant per bucket)
            canonical = f"{canonical}.{digest[:12]}"
        with self.path.open("ab") as f:
            align = PAGE if array.nbytes >= PAGE_ALIGN_BYTES else ALIGN
            offset = -(-f.tell() // align) * align
            f.write(b"\0" * (offset - f.tell()))
            f.write(array.tobytes())
        self.tensors[canonical] = {
            "dtype": array.dtype.name,
            "shape": list(array.shape),
            "offset": offset,
            "length": array.nbytes,
        }
        self._by_content[digest] = canonical
        return canonical

    def externalize(self, model: onnx.ModelProto) -> list[str]:
        """Move `model`'s large initializers into the file and point the graph at it; returns their names."""
        renames, shared, duplicates = {}, [], []
        for init in model.graph.initializer:
            array = numpy_helper.to_array(init)
            if array.nbytes < MIN_SHARED_BYTES:
                continue
            canonical = self.add(init.name, array)
            entry = self.tensors[canonical]
            renames[init.name] = canonical
            if canonical in shared:  # the same content twice in one graph: keep one initializer
                duplicates.append(init)
                continue
            init.name = canonical
            init.ClearField("raw_data")
            for f in ("float_data", "int32_data", "int64_data", "double_data", "uint64_data", "string_data"):
                init.ClearField(f)
            init.data_location = onnx.TensorProto.EXTERNAL
            del init.external_data[:]
            for key, value in (("location", self.path.name), ("offset", entry["offset"]), ("length", entry["length"])):
                init.external_data.add(key=key, value=str(value))
            shared.append(canonical)
        for init in duplicates:
            model.graph.initializer.remove(init)
        _rename_inputs(model.graph, renames)
        return shared


def _rename_inputs(graph: onnx.GraphProto, renames: dict[str, str]) -> None:
    for node in graph.node:
        for i, name in enumerate(node.input):
            if name in renames:
                node.input[i] = renames[name]
        for attr in node.attribute:  # subgraphs (none expected; kept correct anyway)
            if attr.type == onnx.AttributeProto.GRAPH:
                _rename_inputs(attr.g, renames)
    for value in graph.value_info:
        if value.name in renames:
            value.name = renames[value.name]


def io_spec(model: onnx.ModelProto) -> dict:
    """Input/output names, dtypes and shapes (symbolic dims by name) of a graph."""

    def describe(values):
        out = []
        for v in values:
            t = v.type.tensor_type
            shape = [d.dim_param if d.dim_param else d.dim_value for d in t.shape.dim]
            out.append(
                {"name": v.name, "dtype": onnx.helper.tensor_dtype_to_np_dtype(t.elem_type).name, "shape": shape}
            )
        return out

    return {"inputs": describe(model.graph.input), "outputs": describe(model.graph.output)}


# FusedGemm(activation=A) → Gemm, A: ORT's offline optimisation fuses the pooler's dense + tanh into
# its contrib op FusedGemm, which OpenVINO's ONNX reader mistranslates (a classifier's logits came
# out wrong by 1.5 at fp32). Split back, the graph is standard ONNX there, at the cost of one
# elementwise op on (B, d).
SPLIT_ACTIVATIONS = ("Tanh", "Relu", "Sigmoid")


def split_fused_gemms(model: onnx.ModelProto) -> int:
    """Replace every FusedGemm whose activation is a plain ONNX op by Gemm + that op; the count."""
    nodes, split = [], 0
    for node in model.graph.node:
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        activation = attrs.get("activation", b"").decode() if node.op_type == "FusedGemm" else ""
        if node.domain != "com.microsoft" or activation not in SPLIT_ACTIVATIONS:
            nodes.append(node)
            continue
        gemm_attrs = {k: v for k, v in attrs.items() if not k.startswith("activation")}
        linear = f"{node.output[0]}/linear"
        nodes.append(onnx.helper.make_node("Gemm", list(node.input), [linear], name=f"{node.name}/gemm", **gemm_attrs))
        nodes.append(onnx.helper.make_node(activation, [linear], list(node.output), name=f"{node.name}/{activation}"))
        split += 1
    if split:
        del model.graph.node[:]
        model.graph.node.extend(nodes)
    return split


def finish_graph(src: Path, dst: Path, weights: WeightsFileWriter) -> dict:
    """Load an exported/optimised graph, move its weights to the shared file, check and save it."""
    model = onnx.load(str(src), load_external_data=True)
    split_fused_gemms(model)
    shared = weights.externalize(model)
    onnx.save(model, str(dst))
    onnx.checker.check_model(str(dst))  # by path: resolves the external data
    ops = Counter(n.op_type for n in model.graph.node)
    return {"shared_initializers": shared, "op_types": dict(sorted(ops.items())), **io_spec(model)}
