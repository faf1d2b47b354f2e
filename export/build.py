"""`bigs export ARTIFACT_DIR OUT_DIR`: artifact dir → self-contained export dir.

    OUT_DIR/  config.json, model.safetensors, tokenizer files, … (the artifact's files, copied)
              [2_Dense/ the artifact's embedding projection, copied when it has one]
              model code + auto_map, sentence-transformers files, README.md (model/hub.py)
              onnx/<bucket>.onnx [+ <bucket>.int8.onnx] + onnx/weights.bin (shared by all graphs)
              stablehlo/<head>_<bucket>.bin
              manifest.json

Steps: copy the artifact (with `tile_positions`, its position table tiled up to the longest bucket, past the
positions it learned: export/positions.py), and write what stock transformers / sentence-transformers read (a
published checkpoint dir has none of it); load the torch model (fp32); export ONNX per bucket (export/onnx.py) and
StableHLO per head and bucket (export/stablehlo.py); measure every file against the torch reference
on fixed inputs (export/parity.py); hash every file (export/integrity.py); write the manifest
(export/manifest.py). Unless told otherwise (`precisions`), the reduced-precision variants that can
run here are written too, each gated on real text and timed against fp32 on this CPU (export/gate.py,
export/latency.py), so `auto` serves a user's own model at reduced precision with no flag.
Works on `bigs init` / save_pretrained dirs and on published-layout checkpoint dirs alike: both are
read through `from_pretrained` (torch) and the safetensors keys (Flax).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from model.hub import DENSE_DIR, read_dense
from model.positions import POSITIONS_TILED_FROM

from . import parity
from .heads import LABELLED_ARCHITECTURES, heads_for
from .hub_files import write_hub_files
from .integrity import file_table, source_table
from .manifest import (
    INT8_FLOOR_FILE,
    REFUSALS_FILE,
    Int8Accuracy,
    Int8Search,
    Manifest,
    ModelInfo,
    Parity,
    RefusedPrecision,
    TokenizerInfo,
    read_int8_floor,
    read_refusals,
    versions,
)
from .modules import SentenceEmbedding
from .precisions import INT8, REDUCED, written_by_default_here
from .progress import Job, silent
from .verify import DEFAULT_TOLERANCE

if TYPE_CHECKING:
    from .int8_search import Int8Request

DEFAULT_BUCKETS = (128, 256, 512, 1024, 2048, 4096)
PRECISIONS = REDUCED  # what --precisions takes; written without it on this machine: `default_precisions`
FORMATS = ("onnx", "stablehlo")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json")
BERT_VOCAB_SIZE = 30522


DEFAULT = "default"  # `ExportOptions.precisions`: the variants that can be written and gated here


def default_precisions() -> tuple[str, ...]:
    """What `DEFAULT` means on this machine: each reduced precision whose `written_by_default` holds here
    (export/precisions.py: int8 everywhere, OpenVINO's where it is installed and the CPU has the units that make
    them what they say). Which of them serves where is `auto`'s choice by the latency recorded here, OpenVINO's
    only where they pay for the memory of a second runtime (service/precision_policy.py)."""
    return written_by_default_here()


def parse_precisions(text: str | None) -> tuple[str, ...] | str:
    """`--precisions`: not given → DEFAULT; "none" → () (fp32 only); else the comma-separated list."""
    if text is None:
        return DEFAULT
    if text.strip().lower() == "none":
        return ()
    return tuple(p.strip() for p in text.split(",") if p.strip())


@dataclass
class ExportOptions:
    """What to export. `buckets=None`: DEFAULT_BUCKETS up to the model's max_position_embeddings."""

    buckets: list[int] | None = None
    # Buckets past max_position_embeddings, read with the learned position table tiled up to the longest of
    # them and no training (export/positions.py); without it such a bucket is refused
    tile_positions: bool = False
    formats: tuple[str, ...] = FORMATS
    quantize: str | None = None  # None or "int8" (ONNX only): the same as precisions=("int8",)
    # Reduced-precision variants (ONNX only), each measured by its accuracy gate (export/gate.py) and
    # timed (export/latency.py): names of export/precisions.py's `REDUCED`. DEFAULT (what `bigs export`
    # asks without --precisions): `default_precisions()` where the gate can run, i.e. with ONNX among the
    # formats and a tokenizer in the dir, else none. The empty default here keeps a program's export what it
    # states.
    precisions: tuple[str, ...] | str = ()
    embed_weights: bool = False  # StableHLO: weights inside each artifact instead of arguments
    tolerance: float = DEFAULT_TOLERANCE
    seed: int = 0  # of the parity inputs
    # The int8 search's floor (export/manifest.py `Int8Floor`): None, the artifact dir's (`INT8_FLOOR_FILE`; none
    # where it has none); a number, this one instead, and int8 written even where the dir refuses it, since
    # this is how a floor is measured before `bigs eval --refuse-beyond` records it
    int8_floor: int | None = None

    def __post_init__(self):
        bad = [f for f in self.formats if f not in FORMATS]
        if bad:
            raise ValueError(f"unknown format(s) {bad}; choose from {FORMATS}")
        if self.quantize not in (None, INT8):
            raise ValueError(f"--quantize supports int8 only, got {self.quantize!r}")
        if self.int8_floor is not None and self.int8_floor < 0:
            raise ValueError(f"--int8-floor is a count of weight products, 0 or more, not {self.int8_floor}")
        if self.precisions == DEFAULT:
            return  # resolved by `variants_to_write` once the export dir has its tokenizer
        bad = [p for p in self.precisions if p not in PRECISIONS]
        if bad:
            raise ValueError(f"unknown precision(s) {bad}; choose from {PRECISIONS}")
        if self.quantize and self.quantize not in self.precisions:
            self.precisions = (*self.precisions, self.quantize)
        if self.precisions and "onnx" not in self.formats:
            raise ValueError("reduced precisions are variants of the ONNX graphs: add onnx to the formats")


def variants_to_write(
    options: ExportOptions, tokenizer: TokenizerInfo, refused: dict[str, RefusedPrecision] | None = None
) -> tuple[str, ...]:
    """The reduced precisions this export writes: those asked for, or for DEFAULT those that can be gated
    here, less those the artifact dir refuses (`refused`, export/manifest.py `REFUSALS_FILE`: its held-out figure
    lost more than the model allows), each said in a line. The gate runs real text, so a dir without
    tokenizer.json (an artifact with its own vocabulary and no tokenizer) gets none by default, and export says
    so; asked for, it is an error."""
    if options.precisions != DEFAULT:
        wanted = tuple(options.precisions)
    elif "onnx" not in options.formats:
        return ()
    elif "tokenizer.json" not in tokenizer.files:
        print("no reduced-precision variants: their accuracy gate runs real text and the dir has no tokenizer.json")
        return ()
    else:
        wanted = default_precisions()
    refused = dict(refused or {})
    if options.int8_floor is not None and INT8 in wanted and refused.pop(INT8, None) is not None:
        print(f"int8 written with --int8-floor {options.int8_floor} though the model dir refuses it ({REFUSALS_FILE}): "
              "score it with `bigs eval --precision int8 --refuse-beyond` to keep or refuse that floor")  # fmt: skip
    for precision in (p for p in wanted if p in refused):
        print(f"no {precision} variant: the model dir refuses it ({REFUSALS_FILE}): {refused[precision].why()}")
    return tuple(p for p in wanted if p not in refused)


def resolve_buckets(
    requested: list[int] | None, max_length: int, fixed_length: int | None = None, tile_positions: bool = False
) -> list[int]:
    """Requested buckets (checked), or the defaults capped at the model's length; the model's own
    max length is added when no default reaches it, so every valid input has a bucket. A bucket past the
    model's length is refused unless `tile_positions` (its learned positions tiled up to the longest bucket,
    export/positions.py), which then needs one. A model tied to N positions (`BiGSConfig.fixed_length`: gMLP,
    the synthesizers) has the one bucket N, which holds every input it can read (docs/DESIGN.md §2.8);
    another bucket is refused, tiled or not."""
    if fixed_length is not None:
        others = sorted(set(requested or []) - {fixed_length})
        if others or tile_positions:
            asked = f"buckets {others}" if others else "--tile-positions"
            raise ValueError(
                f"{asked}: this model is tied to {fixed_length} positions (a learned {fixed_length} × "
                f"{fixed_length} matrix over positions) and is exported and served at bucket {fixed_length} only"
            )
        return [fixed_length]
    if tile_positions and not any(b > max_length for b in requested or []):
        raise ValueError(f"--tile-positions tiles the positions up to the longest bucket: give --buckets past the "
                         f"model's max_position_embeddings={max_length}")  # fmt: skip
    if requested:
        too_long = [b for b in requested if b < 1 or (b > max_length and not tile_positions)]
        if too_long:
            raise ValueError(
                f"buckets {too_long} outside 1..max_position_embeddings={max_length} (past it, --tile-positions "
                "reads them with the learned positions tiled and no training)"
            )
        return sorted(set(requested))
    buckets = [b for b in DEFAULT_BUCKETS if b <= max_length]
    if not buckets or buckets[-1] < max_length:
        buckets.append(max_length)
    return buckets


def refuse_tiling_in_place(artifact_dir: str | Path, out_dir: str | Path, tile_positions: bool) -> None:
    """Tiling rewrites the export's copy of the weights and config: never the artifact's own."""
    if tile_positions and Path(artifact_dir).resolve() == Path(out_dir).resolve():
        raise ValueError("--tile-positions rewrites the export's weights and config.json: export to another dir "
                         "than the artifact's")  # fmt: skip


def copy_artifact(artifact_dir: Path, out_dir: Path) -> None:
    """The artifact's top-level files into out_dir (the export dir must be self-contained), and its
    Dense (2_Dense/), which the embeddings head applies; an earlier export's Dense is removed when the
    artifact has none. The other sentence-transformers dirs are written from config.json."""
    out_dir.mkdir(parents=True, exist_ok=True)
    if artifact_dir.resolve() == out_dir.resolve():
        return
    for path in artifact_dir.iterdir():
        if path.is_file():
            shutil.copy2(path, out_dir / path.name)
    for taken_back in (REFUSALS_FILE, INT8_FLOOR_FILE):  # an earlier export's copy of a file since removed
        if not (artifact_dir / taken_back).is_file():
            (out_dir / taken_back).unlink(missing_ok=True)
    shutil.rmtree(out_dir / DENSE_DIR, ignore_errors=True)
    if (artifact_dir / DENSE_DIR).is_dir():
        shutil.copytree(artifact_dir / DENSE_DIR, out_dir / DENSE_DIR)


def tokenizer_of(model_dir: Path) -> TokenizerInfo | None:
    """The dir's own tokenizer files; None when it has none."""
    present = [f for f in TOKENIZER_FILES if (model_dir / f).is_file()]
    return TokenizerInfo(files=present, source="artifact") if present else None


def ensure_tokenizer(out_dir: Path, config) -> TokenizerInfo:
    """Tokenizer files of the dir; a published checkpoint dir may have none: BiGS uses BERT uncased
    WordPiece, so with the BERT vocab size the project's copy is written (and the manifest says so)."""
    present = tokenizer_of(out_dir)
    if present is not None:
        return present
    if config.vocab_size == BERT_VOCAB_SIZE:
        from model.tokenizer import save_tokenizer

        written = save_tokenizer(out_dir, model_max_length=config.max_position_embeddings)
        return TokenizerInfo(
            files=sorted(written), source="bert-base-uncased WordPiece (model/assets), artifact had none"
        )
    return TokenizerInfo(
        files=[], source=f"none: artifact has no tokenizer and vocab_size={config.vocab_size} is not BERT's"
    )


def export_artifact(
    artifact_dir: str | Path,
    out_dir: str | Path,
    options: ExportOptions | None = None,
    report: Callable[[str], object] | None = None,
) -> Manifest:
    """Export `artifact_dir` into `out_dir`; returns the manifest (also written to out_dir/manifest.json).
    `report(line)` gets a progress line as each bucket of each stage finishes (`bigs export` prints them)."""
    options = options or ExportOptions()
    artifact_dir, out_dir = Path(artifact_dir), Path(out_dir)
    job = Job(f"export {artifact_dir}", emit=report or silent)  # started now: every line's "elapsed"
    if not (artifact_dir / "config.json").is_file():
        raise FileNotFoundError(f"{artifact_dir}/config.json not found: not an artifact dir")
    refuse_tiling_in_place(artifact_dir, out_dir, options.tile_positions)
    source = source_table(artifact_dir)  # before anything is written (the out dir may be the artifact's)
    copy_artifact(artifact_dir, out_dir)
    buckets = export_buckets(out_dir, options)
    write_hub_files(out_dir)
    for stale in ("onnx", "stablehlo"):  # a re-export must not leave files of an earlier one
        shutil.rmtree(out_dir / stale, ignore_errors=True)

    model = parity.load_reference(out_dir)  # the one torch reference of this export
    dense = read_dense(out_dir)
    embedding = SentenceEmbedding(dense).eval()  # the embeddings head: mean over real tokens [→ Dense]
    config = model.config
    tokenizer = ensure_tokenizer(out_dir, config)
    manifest = describe_artifact(artifact_dir.resolve().name, config, dense, tokenizer, buckets, options)
    manifest.source = source
    manifest.refused = read_refusals(artifact_dir)
    if options.int8_floor is not None:  # int8 asked for at a floor of its own: measured, so not refused here
        manifest.refused.pop(INT8, None)

    precisions = variants_to_write(options, manifest.tokenizer, manifest.refused)
    searched: Int8Search | None = None  # the int8 search's record, once it has run (at the first buckets)
    if "onnx" in options.formats:
        from .onnx import export_onnx

        quantize = INT8 if INT8 in precisions else None
        onnx_lines = job.stage(len(buckets))
        graphs = " + int8" if quantize else ""  # int8 is quantized from each bucket's graph
        onnx_done = lambda b: onnx_lines.step(f"onnx bucket {b}{graphs}")
        exported = export_onnx(
            model,
            buckets,
            out_dir / "onnx",
            quantize=quantize,
            embedding=embedding,
            done=onnx_done,
            int8=int8_request(out_dir, manifest, job, options.int8_floor) if quantize else None,
        )
        manifest.onnx, searched = exported.section, exported.int8_search
    if "stablehlo" in options.formats:
        from model.convert import load_torch_safetensors

        from .stablehlo import export_stablehlo

        state = load_torch_safetensors(out_dir / "model.safetensors")
        hlo_lines = job.stage(len(buckets) * len(manifest.heads))  # a file per head and bucket
        hlo_done = lambda head, b: hlo_lines.step(f"stablehlo {head} bucket {b}")
        manifest.stablehlo = export_stablehlo(
            config,
            state,
            manifest.model.architecture,
            buckets,
            out_dir,
            embed_weights=options.embed_weights,
            done=hlo_done,
            dense=dense,
        )

    reference_lines = job.stage(len(buckets))
    reference_done = lambda b: reference_lines.step(f"torch reference bucket {b}")
    refs = parity.references(model, manifest, embedding, done=reference_done)
    parity_lines = job.stage(parity.measure_steps(manifest))
    parity_done = lambda what: parity_lines.step(f"parity {what}")
    record_parity(manifest, parity.measure_export(out_dir, manifest, refs, options.tolerance, done=parity_done))
    job.emit(f"{job.name}: parity against torch {'passed' if manifest.parity.passed else 'FAILED'}")
    if precisions:
        from .gate import measure_variants

        already = {INT8: searched.gated_graphs()} if searched else {}
        measure_variants(out_dir, manifest, precisions, job=job, already=already)
        if INT8 in manifest.precisions and searched:
            manifest.precisions[INT8].search = searched
    record_hashes(manifest, out_dir)
    manifest.write(out_dir)
    return manifest


def export_buckets(out_dir: Path, options: ExportOptions) -> list[int]:
    """The export's buckets (`resolve_buckets`); where the longest is past the model's positions (asked for with
    `tile_positions`), the copy's position table is tiled up to it first (export/positions.py), and a line says
    so: a user must not get untrained positions without being told."""
    from model import BiGSConfig

    from .positions import describe_tiling, tile_dir_positions

    config = BiGSConfig.from_pretrained(str(out_dir))
    length = config.max_position_embeddings
    buckets = resolve_buckets(options.buckets, length, config.fixed_length, options.tile_positions)
    if buckets[-1] > length:
        learned = tile_dir_positions(out_dir, buckets[-1])
        print(describe_tiling(learned, buckets[-1]), flush=True)
    return buckets


def int8_request(out_dir: Path, manifest: Manifest, job: Job, floor: int | None = None) -> Int8Request | None:
    """What this export's int8 search is given (export/int8_search.py `Int8Request`, run by `export_onnx` once the
    fp32 graphs of the buckets it searches at are written): the gate's tokenizer and head, the recipe for this
    CPU, and the int8 floor (`floor`, `ExportOptions.int8_floor`; None: the model dir's). None without the
    tokenizer the gate needs (`variants_to_write` asks for int8 only with one): the default recipe at every
    bucket."""
    if not (out_dir / "tokenizer.json").is_file():
        return None
    from tokenizers import Tokenizer

    from .cpu import has_exact_int8_products
    from .heads import primary_head
    from .int8_recipe import Int8Recipe
    from .int8_search import Int8Request

    tokenizer = Tokenizer.from_file(str(out_dir / "tokenizer.json"))
    tokenizer.no_truncation()
    tokenizer.no_padding()
    # the SSM convolutions' inputs signed (u8·s8, faster) only where this CPU's int8 sums cannot saturate
    recipe = Int8Recipe(ssm_signed_inputs=has_exact_int8_products())
    if floor is not None:
        floor_why = f"bigs export --int8-floor {floor}"
    else:  # the export dir holds the artifact's copy (`copy_artifact`)
        model_floor = read_int8_floor(out_dir)
        floor, floor_why = (0, None) if model_floor is None else (model_floor.fp32_products, model_floor.why())
    head = primary_head(manifest.model.architecture)
    return Int8Request(tokenizer, head, recipe, floor, floor_why, job=job)


def describe_artifact(
    name: str, config, dense, tokenizer: TokenizerInfo, buckets: list[int], options: ExportOptions | None = None
) -> Manifest:
    """The manifest of a model before anything of it is exported: what it is, its heads, labels, tokenizer and
    buckets, and how parity will be measured. `bigs export` fills in the rest; `bigs serve`, given an
    artifact dir, serves the artifact on torch with this while its export is written (service/preparation.py)."""
    options = options or ExportOptions()
    architecture = parity.architecture_of(config)
    return Manifest(
        model=ModelInfo(
            name=name,
            architecture=architecture,
            model_type=config.model_type,
            vocab_size=config.vocab_size,
            hidden_size=config.hidden_size,
            num_hidden_layers=config.num_hidden_layers,
            max_position_embeddings=config.max_position_embeddings,
            positions_tiled_from=getattr(config, POSITIONS_TILED_FROM, None),
            pad_token_id=config.pad_token_id,
            embedding_size=config.hidden_size if dense is None else dense.out_features,
        ),
        heads=heads_for(architecture),
        embeddings=describe_embeddings(dense),
        labels=dict(config.id2label) if architecture in LABELLED_ARCHITECTURES else None,
        tokenizer=tokenizer,
        buckets=buckets,
        parity=Parity(
            reference="torch, fp32, ssm_formulation='fft' (kernels in float64), same weights",
            tolerance=options.tolerance,
            criterion="max_abs_diff <= tolerance * max(1, reference_max_abs), per output",
            seed=options.seed,
            cases=parity.CASES,
        ),
        versions=versions(),
    )


def describe_artifact_dir(artifact_dir: str | Path) -> Manifest:
    """`describe_artifact` of an artifact dir as it is, written nowhere: what `bigs serve` needs to serve
    the artifact on torch before its export exists. It needs the dir's own tokenizer.json (the service
    tokenizes with it); a dir without one is exported first, which writes BERT's."""
    from model import BiGSConfig

    artifact_dir = Path(artifact_dir)
    tokenizer = tokenizer_of(artifact_dir)
    if tokenizer is None or "tokenizer.json" not in tokenizer.files:
        raise ValueError(f"{artifact_dir} has no tokenizer.json: export it with `bigs export` (which writes BERT's "
                         "WordPiece for a BERT vocabulary) and serve the export dir")  # fmt: skip
    config = BiGSConfig.from_pretrained(str(artifact_dir))
    buckets = resolve_buckets(None, config.max_position_embeddings, config.fixed_length)
    return describe_artifact(artifact_dir.resolve().name, config, read_dense(artifact_dir), tokenizer, buckets)


def describe_embeddings(dense) -> str:
    """The manifest's `embeddings`: what the embeddings head computes."""
    pooled = "mean of the last hidden state over real tokens (attention_mask = 1), before the pooler"
    if dense is None:
        return pooled
    return (
        f"{pooled}, then {DENSE_DIR} (sentence-transformers' Dense, identity activation): "
        f"a linear map {dense.in_features} → {dense.out_features}"
    )


def record_parity(manifest: Manifest, report: parity.ParityReport) -> None:
    """Each runtime file's measured differences beside it; int8 as accuracy against the fp32 reference."""
    for bucket, measured in report.onnx.items():
        manifest.onnx.buckets[bucket] = manifest.onnx.buckets[bucket].model_copy(update=measured.model_dump())
    for bucket, (measured, top1) in report.onnx_int8.items():
        manifest.onnx.buckets[bucket].int8.accuracy = Int8Accuracy(
            against="torch fp32 reference, the parity inputs",
            max_abs_logits_diff=measured.max_abs_diff.get("logits"),  # none in an embedding model's graphs
            max_abs_embeddings_diff=measured.max_abs_diff["embeddings"],
            top1_agreement=top1,
        )
    for head, per_bucket in report.stablehlo.items():
        artifacts = manifest.stablehlo.heads[head].buckets
        for bucket, measured in per_bucket.items():
            artifacts[bucket] = artifacts[bucket].model_copy(update=measured.model_dump())
    manifest.parity.passed = not report.breaches
    manifest.parity.breaches = report.breaches


def record_hashes(manifest: Manifest, out_dir: Path) -> None:
    """Every file's sha256 (export/integrity.py), repeated beside each runtime file's other facts."""
    manifest.files = file_table(out_dir)
    if manifest.onnx is not None:
        for graph in manifest.onnx.buckets.values():
            for g in (graph, graph.int8):
                if g is not None:
                    g.sha256 = manifest.files[g.file].sha256
        manifest.onnx.weights_sha256 = manifest.files[manifest.onnx.weights_file].sha256
    if manifest.stablehlo is not None:
        for artifact in manifest.stablehlo.artifacts():
            artifact.sha256 = manifest.files[artifact.file].sha256


def summary(manifest: Manifest, out_dir: str | Path) -> str:
    """A few lines for the terminal: what was written and how far it is from the reference."""
    lines = [f"exported {manifest.model.name} ({manifest.model.architecture}) to {out_dir}"]
    lines.append(f"  heads {', '.join(manifest.heads)}; buckets {manifest.buckets}")
    if manifest.model.positions_tiled_from is not None:
        from .positions import describe_tiling

        lines.append(
            f"  {describe_tiling(manifest.model.positions_tiled_from, manifest.model.max_position_embeddings)}"
        )
    if manifest.onnx is not None:
        for bucket, e in manifest.onnx.buckets.items():
            form = "no SSM" if e.ssm_formulation is None else e.ssm_formulation
            form += f" (chunk {e.chunk})" if e.chunk else ""
            line = f"  onnx {bucket:>5}: {form:<20} {parity.describe(e)}"
            if e.int8 is not None and e.int8.accuracy is not None:
                acc = e.int8.accuracy
                if acc.top1_agreement is None:  # an embedding model: no logits
                    line += f"; int8 max abs embeddings diff {acc.max_abs_embeddings_diff:.3g}"
                else:
                    line += (
                        f"; int8 max abs logits diff {acc.max_abs_logits_diff:.3g}, "
                        f"top-1 agreement {acc.top1_agreement:.3f}"
                    )
            lines.append(line)
    for precision, refusal in manifest.refused.items():
        lines.append(f"  {precision}: not written, the model dir refuses it: {refusal.why()}")
    for precision, variant in manifest.precisions.items():
        gates = variant.gate.values()
        cosine = min(m.embedding_cosine_min for m in gates)
        verdict = "passed" if variant.passed else "FAILED: " + "; ".join(variant.failures())
        if all(m.max_abs_logit_diff is None for m in gates):  # an embedding model: the cosine is the gate
            worst = f"worst embedding cosine {cosine:.4f}"
            tokens = [m for m in gates if m.token_cosine_min is not None]
            if tokens:  # recorded beside the gate, not part of it
                worst += (f" (per token, not gated: mean {min(m.token_cosine_mean for m in tokens):.4f} at worst, "
                          f"min {min(m.token_cosine_min for m in tokens):.4f})")  # fmt: skip
        else:
            agreement = min(
                m.classification_agreement if m.fill_mask_top1_agreement is None else m.fill_mask_top1_agreement
                for m in gates
            )
            logit_diff = max(m.max_abs_logit_diff for m in gates)
            worst = (
                f"worst top-1 agreement {agreement:.3f}, embedding cosine {cosine:.4f}, max logit diff {logit_diff:.3g}"
            )
        lines.append(f"  {precision} ({variant.runtime}) gate on real text: {worst}: {verdict}")
        if variant.search is not None:
            search = variant.search
            lines.append(
                f"    {len(search.fp32)} of {search.products} weight products left fp32 "
                f"({search.chosen.fp32_macs_share:.0%} of their multiply-adds) by the int8 search at bucket "
                f"{search.bucket} ({len(search.tries)} {'try' if len(search.tries) == 1 else 'tries'}); "
                f"weights {search.weight_bits}-bit"
            )
            if search.floor:
                lines[-1] += f"; from a floor of {search.floor} ({search.floor_why})"
            if search.smoothing:
                calibrated = ", ".join(map(str, search.calibrated_at or [search.bucket]))
                lines[-1] += f"; smoothed (SmoothQuant-style, factors from bucket {calibrated})"
            if search.ssm_convolutions:
                lines[-1] += "; SSM convolutions int8" + (" (inputs signed)" if search.ssm_inputs_signed else "")
            if search.gelu_approximation:
                lines[-1] += "; GELU in its tanh form"
            if search.ssm_convolutions or search.gelu_approximation:
                levered = [b for b in manifest.buckets if any(search.levers_at(b))]
                lines[-1] += f" (at buckets {', '.join(map(str, levered))})"
            for bucket, more in sorted(search.long_products.items()):
                lines.append(
                    f"    at bucket {bucket}: {more.chosen.fp32_products} products fp32, no levers "
                    f"({len(more.fp32)} more than the search's; gate {'passed' if more.passed else 'FAILED'})"
                )
    if manifest.latency is not None:
        figures = manifest.latency.ms
        for bucket in manifest.buckets:
            times = ", ".join(f"{name} {per[bucket]:.3g} ms" for name, per in figures.items() if bucket in per)
            lines.append(f"  latency {bucket:>5}: {times}")
        lines.append(f"    (batch 1, on {manifest.latency.measured_on})")
    if manifest.stablehlo is not None:
        s = manifest.stablehlo
        lines.append(f"  stablehlo: platforms {s.platforms}, weights {s.weights}")
        for head, e in s.heads.items():
            for b, x in e.buckets.items():
                lines.append(f"    {head} {b:>5}: {parity.describe(x)}")
    lines.append(
        f"  parity {'passed' if manifest.parity.passed else 'FAILED'} (tolerance {manifest.parity.tolerance:g})"
    )
    return "\n".join(lines)
