"""Exported = reference: fixed inputs, the torch reference, and the differences measured against it.

The reference is the artifact's torch model in fp32 with `ssm_formulation="fft"` (the model's own
reference convolution, kernels in float64). Inputs are generated from a seed, so export and
`--verify` (and anyone else) rebuild the same ones from the manifest:

    batch1_full    1 sequence filling the bucket (no padding)
    batch5_padded  5 sequences of lengths L, L/2+1, L/4+3, 7, 1, right-padded to the bucket L

Token ids are drawn from [1, vocab), the second half of each sequence is segment 1, and fill-mask
asks for 3 positions inside each sequence's real tokens.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from model.modeling_bigs import BiGSForMaskedLM, BiGSForSequenceClassification, mean_pool

POSITIONS_PER_SEQUENCE = 3
ARCHITECTURES = {"BiGSForMaskedLM": BiGSForMaskedLM, "BiGSForSequenceClassification": BiGSForSequenceClassification}


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


@torch.no_grad()
def reference_outputs(model: torch.nn.Module, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """{"logits", "embeddings"} of the torch reference for one case (fill-mask logits at mask_positions)."""
    ids, mask, types = (torch.from_numpy(inputs[k]) for k in ("input_ids", "attention_mask", "token_type_ids"))
    hidden = model.bigs(ids, attention_mask=mask, token_type_ids=types, return_dict=True).last_hidden_state
    out = {"embeddings": mean_pool(hidden, mask).numpy()}
    if isinstance(model, BiGSForMaskedLM):
        positions = torch.from_numpy(inputs["mask_positions"])
        logits = model(ids, attention_mask=mask, token_type_ids=types, logits_positions=positions).logits
    else:
        logits = model(ids, attention_mask=mask, token_type_ids=types).logits
    out["logits"] = logits.numpy()
    return out


def compare(outputs: dict[str, np.ndarray], reference: dict[str, np.ndarray]) -> dict[str, dict[str, float]]:
    """Per output present in both: max |output − reference| and max |reference| (its scale)."""
    keys = [k for k in outputs if k in reference]
    return {
        "max_abs_diff": {k: float(np.max(np.abs(outputs[k] - reference[k]))) for k in keys},
        "reference_max_abs": {k: float(np.max(np.abs(reference[k]))) for k in keys},
    }


def merge(into: dict, measured: dict) -> dict:
    """Accumulate `compare` results over cases: the max of each number."""
    for group, values in measured.items():
        target = into.setdefault(group, {})
        for k, v in values.items():
            target[k] = max(target.get(k, 0.0), v)
    return into


def error_ratio(measured: dict) -> float:
    """max over outputs of max_abs_diff / max(1, max |reference|): the number held to the tolerance.

    fp32 error grows with the size of the values: outputs of order 1 are held to the tolerance in
    absolute terms, larger ones relative to their scale (a pre-norm residual stream with slowly
    decaying SSMs can reach 1e3–1e4, where fp32 itself is ~1e-3 off)."""
    diffs, scales = measured.get("max_abs_diff", {}), measured.get("reference_max_abs", {})
    return max((d / max(1.0, scales.get(k, 0.0)) for k, d in diffs.items()), default=0.0)


def top1_agreement(logits: np.ndarray, reference: np.ndarray) -> float:
    return float(np.mean(np.argmax(logits, axis=-1) == np.argmax(reference, axis=-1)))
