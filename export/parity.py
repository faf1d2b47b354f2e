"""Exported = reference: fixed inputs, the torch reference, and every runtime file measured against it.

The one place parity is measured: `bigs export` measures and records it in the manifest, and
`bigs export --verify` measures again and compares. The reference is the artifact's torch model in
fp32 with `ssm_formulation="fft"` (the model's own reference convolution, kernels in float64),
loaded once per export. Inputs are generated from a seed, so export and `--verify` (and anyone
else) rebuild the same ones from the manifest:

    batch1_full    1 sequence filling the bucket (no padding)
    batch5_padded  5 sequences of lengths L, L/2+1, L/4+3, 7, 1, right-padded to the bucket L

Token ids are drawn from [1, vocab), the second half of each sequence is segment 1, and fill-mask
asks for 3 positions inside each sequence's real tokens.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from model.modeling_bigs import (
    BiGSForMaskedLM,
    BiGSForQuestionAnswering,
    BiGSForSequenceClassification,
    BiGSForTokenClassification,
    BiGSModel,
)

from .heads import MASK_POSITIONS, SEQUENCE_INPUTS, signature
from .manifest import Manifest, Measured
from .modules import SentenceEmbedding
from .precisions import FP32_GRAPHS, INT8_GRAPHS

POSITIONS_PER_SEQUENCE = 3
ARCHITECTURES = {
    cls.__name__: cls
    for cls in (
        BiGSForMaskedLM,
        BiGSForSequenceClassification,
        BiGSForQuestionAnswering,
        BiGSForTokenClassification,
        BiGSModel,
    )
}


def architecture_of(config) -> str:
    names = [a for a in (config.architectures or []) if a in ARCHITECTURES]
    if not names:
        raise ValueError(f"config.architectures = {config.architectures}: expected one of {sorted(ARCHITECTURES)}")
    return names[0]


def load_reference(artifact_dir: str | Path) -> torch.nn.Module:
    """The artifact's torch model, fp32, FFT reference SSM, eval mode."""
    from model import BiGSConfig

    config = BiGSConfig.from_pretrained(str(artifact_dir))
    cls = ARCHITECTURES[architecture_of(config)]
    model = cls.from_pretrained(str(artifact_dir), ssm_formulation="fft")
    return model.float().eval()


CASES = {
    "batch1_full": "1 sequence of the bucket's length L",
    "batch5_padded": "5 sequences of lengths L, L/2+1, L/4+3, 7, 1 right-padded to L",
}


def sequence_lengths(bucket: int) -> dict[str, list[int]]:
    return {
        "batch1_full": [bucket],
        "batch5_padded": [bucket, bucket // 2 + 1, min(bucket, bucket // 4 + 3), min(bucket, 7), 1],
    }


def parity_cases(vocab_size: int, type_vocab_size: int, bucket: int, seed: int = 0) -> dict[str, dict[str, np.ndarray]]:
    """The fixed inputs of one bucket: {case: {input name: int64 array}}."""
    cases = {}
    for c, (name, lengths) in enumerate(sequence_lengths(bucket).items()):
        rng = np.random.default_rng([seed, bucket, c])
        B = len(lengths)
        ids = np.zeros((B, bucket), np.int64)
        mask = np.zeros_like(ids)
        types = np.zeros_like(ids)
        positions = np.zeros((B, POSITIONS_PER_SEQUENCE), np.int64)
        for row, n in enumerate(lengths):
            ids[row, :n] = rng.integers(1, vocab_size, n)
            mask[row, :n] = 1
            if type_vocab_size > 1:
                types[row, n // 2 : n] = 1
            positions[row] = rng.integers(0, n, POSITIONS_PER_SEQUENCE)
        cases[name] = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types, "mask_positions": positions}
    return cases


# A case: its inputs and the reference's outputs ({"logits", "embeddings"}).
Reference = dict[str, dict[str, np.ndarray]]
References = dict[int, dict[str, Reference]]  # {bucket: {case: {"inputs": …, "outputs": …}}}


@torch.no_grad()
def reference_outputs(
    model: torch.nn.Module, inputs: dict[str, np.ndarray], embedding: SentenceEmbedding | None = None
) -> dict[str, np.ndarray]:
    """{"logits", "embeddings"} of the torch reference for one case (fill-mask logits at mask_positions);
    `embedding` the dir's embeddings head (`SentenceEmbedding.of_dir`: its Dense, if any). The bare
    encoder (BiGSModel, an embedding model) has no logits: {"embeddings", "token_embeddings"}, the
    latter its last hidden state at every position (padding's included: the graph's output is)."""
    embedding = embedding if embedding is not None else SentenceEmbedding()
    ids, mask, types = (torch.from_numpy(inputs[k]) for k in SEQUENCE_INPUTS)
    if isinstance(model, BiGSModel):
        hidden = model(ids, attention_mask=mask, token_type_ids=types, return_dict=True).last_hidden_state
        return {"embeddings": embedding(hidden, mask).numpy(), signature("token-embeddings").output: hidden.numpy()}
    # The embeddings read the encoder's last hidden state on the head's own pass: the float64-kernel
    # encoder is most of an export's reference time at long buckets, so it runs once per case, not twice.
    encoder_states: list[torch.Tensor] = []
    keep_states = lambda _module, _args, output: encoder_states.append(output.last_hidden_state)
    hook = model.base_model.register_forward_hook(keep_states)
    try:
        if isinstance(model, BiGSForMaskedLM):
            positions = torch.from_numpy(inputs[MASK_POSITIONS])
            logits = model(ids, attention_mask=mask, token_type_ids=types, logits_positions=positions).logits
        elif isinstance(model, BiGSForQuestionAnswering):  # the head's one output: (B, L, 2), start then end
            spans = model(ids, attention_mask=mask, token_type_ids=types)
            logits = torch.stack([spans.start_logits, spans.end_logits], dim=-1)
        else:
            logits = model(ids, attention_mask=mask, token_type_ids=types).logits
    finally:
        hook.remove()
    (hidden,) = encoder_states
    return {"embeddings": embedding(hidden, mask).numpy(), "logits": logits.numpy()}


def references(
    model: torch.nn.Module,
    manifest: Manifest,
    embedding: SentenceEmbedding | None = None,
    done: Callable[[int], object] | None = None,
) -> References:
    """The reference's outputs on every bucket's cases (the model and its embeddings head are loaded by
    the caller, once). `done(bucket)` is called as each bucket's are computed (the export's progress
    lines: at long buckets the float64-kernel reference is most of the parity run)."""
    config = model.config
    refs: References = {}
    for bucket in manifest.buckets:
        cases = parity_cases(config.vocab_size, config.type_vocab_size, bucket, manifest.parity.seed)
        refs[bucket] = {
            case: {"inputs": inputs, "outputs": reference_outputs(model, inputs, embedding)}
            for case, inputs in cases.items()
        }
        if done is not None:
            done(bucket)
    return refs


# --------------------------------------------------------------------------------------------
# Differences
# --------------------------------------------------------------------------------------------


class Accumulator:
    """Max |output − reference| and max |reference| per output over cases, and top-1 agreement."""

    def __init__(self):
        self.diff: dict[str, float] = {}
        self.scale: dict[str, float] = {}
        self.agreement: list[float] = []

    def add(self, outputs: dict[str, np.ndarray], reference: dict[str, np.ndarray]) -> None:
        for k in (k for k in outputs if k in reference):
            self.diff[k] = max(self.diff.get(k, 0.0), float(np.max(np.abs(outputs[k] - reference[k]))))
            self.scale[k] = max(self.scale.get(k, 0.0), float(np.max(np.abs(reference[k]))))
        if "logits" in outputs and "logits" in reference:
            self.agreement.append(top1_agreement(outputs["logits"], reference["logits"]))

    def measured(self) -> Measured:
        return Measured(max_abs_diff=self.diff, reference_max_abs=self.scale)

    def top1(self) -> float | None:
        """None for outputs without logits (an embedding model's): there is no top-1 to agree on."""
        return sum(self.agreement) / len(self.agreement) if self.agreement else None


def error_ratio(measured: Measured) -> float:
    """max over outputs of max_abs_diff / max(1, max |reference|): the number held to the tolerance.

    fp32 error grows with the size of the values: outputs of order 1 are held to the tolerance in
    absolute terms, larger ones relative to their scale (a pre-norm residual stream with slowly
    decaying SSMs can reach 1e3–1e4, where fp32 itself is ~1e-3 off)."""
    diffs, scales = measured.max_abs_diff or {}, measured.reference_max_abs or {}
    return max((d / max(1.0, scales.get(k, 0.0)) for k, d in diffs.items()), default=0.0)


def describe(measured: Measured) -> str:
    """'max abs diff 1.2e-05 (scaled 1.2e-05)': the worst output's difference, and the scaled ratio."""
    worst_abs = max((measured.max_abs_diff or {}).values(), default=0.0)
    return f"max abs diff {worst_abs:.2e} (scaled {error_ratio(measured):.2e})"


def top1_agreement(logits: np.ndarray, reference: np.ndarray) -> float:
    return float(np.mean(np.argmax(logits, axis=-1) == np.argmax(reference, axis=-1)))


# --------------------------------------------------------------------------------------------
# Measuring the runtime files, through the loaders the service uses
# --------------------------------------------------------------------------------------------


def measure_onnx(
    export_dir: Path,
    manifest: Manifest,
    refs: References,
    variant: str = FP32_GRAPHS,
    done: Callable[[str], object] | None = None,
) -> dict[int, tuple[Measured, float | None]]:
    """{bucket: (differences, top-1 agreement)} of the ONNX graphs of one variant ("fp32", "int8").
    `done(what)` is called as each bucket is measured (the export's progress lines)."""
    from .onnx_runtime import load_sessions

    results = {}
    for bucket, session in load_sessions(export_dir, variant=variant, manifest=manifest).items():
        names = [i.name for i in session.get_inputs()]
        outputs = [o.name for o in session.get_outputs()]
        acc = Accumulator()
        for case in refs[bucket].values():
            got = dict(zip(outputs, session.run(None, {k: case["inputs"][k] for k in names}), strict=True))
            acc.add(got, case["outputs"])
        results[bucket] = (acc.measured(), acc.top1())
        if done is not None:
            done(f"onnx {variant} bucket {bucket}")
    return results


def measure_stablehlo(
    export_dir: Path, manifest: Manifest, refs: References, done: Callable[[str], object] | None = None
) -> dict[str, dict[int, Measured]]:
    """{head: {bucket: differences}} of the StableHLO artifacts; `done(what)` as for `measure_onnx`."""
    from .stablehlo_runtime import load_stablehlo, param_store

    store = param_store(export_dir)
    results: dict[str, dict[int, Measured]] = {}
    for head, entry in manifest.stablehlo.heads.items():
        results[head] = {}
        for bucket in entry.buckets:
            run = load_stablehlo(export_dir, head, bucket, store=store, manifest=manifest)
            acc = Accumulator()
            for case in refs[bucket].values():
                acc.add(run(*(case["inputs"][name] for name in run.input_names)), case["outputs"])
            results[head][bucket] = acc.measured()
            if done is not None:
                done(f"stablehlo {head} bucket {bucket}")
    return results


@dataclass
class ParityReport:
    """Every runtime file of an export dir measured against the reference, and what broke the tolerance."""

    onnx: dict[int, Measured] = field(default_factory=dict)
    onnx_int8: dict[int, tuple[Measured, float | None]] = field(default_factory=dict)
    stablehlo: dict[str, dict[int, Measured]] = field(default_factory=dict)
    breaches: list[str] = field(default_factory=list)  # over the tolerance, or could not run


def measure_steps(manifest: Manifest) -> int:
    """How many files `measure_export` measures: one `done` call each."""
    steps = 0
    if manifest.onnx is not None:
        graphs = manifest.onnx.buckets.values()
        steps += len(graphs) + (len(graphs) if any(g.int8 is not None for g in graphs) else 0)
    if manifest.stablehlo is not None:
        steps += sum(len(entry.buckets) for entry in manifest.stablehlo.heads.values())
    return steps


def measure_export(
    export_dir: Path,
    manifest: Manifest,
    refs: References,
    tolerance: float,
    done: Callable[[str], object] | None = None,
) -> ParityReport:
    """Measure every format the manifest lists; fp32 files are held to `tolerance` (int8 is measured
    here, and held to its accuracy gate on real text: export/gate.py). `done(what)` is called as
    each file is measured (`measure_steps` of them)."""
    report = ParityReport()

    def attempt(what: str, measure):
        try:
            return measure()
        except Exception as error:  # a file that does not run is a parity failure, reported as one
            report.breaches.append(f"{what}: could not run: {type(error).__name__}: {error}")
            return {}

    if manifest.onnx is not None:
        fp32 = attempt("onnx", lambda: measure_onnx(export_dir, manifest, refs, done=done))
        report.onnx = {bucket: measured for bucket, (measured, _) in fp32.items()}
        for bucket, measured in report.onnx.items():
            if error_ratio(measured) > tolerance:
                report.breaches.append(f"onnx bucket {bucket}: {describe(measured)} > tolerance {tolerance:g}")
        if any(graph.int8 is not None for graph in manifest.onnx.buckets.values()):
            report.onnx_int8 = attempt("onnx int8", lambda: measure_onnx(export_dir, manifest, refs, INT8_GRAPHS, done))
    if manifest.stablehlo is not None:
        report.stablehlo = attempt("stablehlo", lambda: measure_stablehlo(export_dir, manifest, refs, done))
        for head, per_bucket in report.stablehlo.items():
            for bucket, measured in per_bucket.items():
                if error_ratio(measured) > tolerance:
                    report.breaches.append(
                        f"stablehlo {head} bucket {bucket}: {describe(measured)} > tolerance {tolerance:g}"
                    )
    return report
