"""Model outputs → wire answers: softmax / sigmoid, top-k, decoded tokens (as transformers does)."""

from __future__ import annotations

import numpy as np

from .tokenization import RequestTokenizer


def softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(axis=-1, keepdims=True)
    exp = np.exp(shifted)
    return exp / exp.sum(axis=-1, keepdims=True)


def sigmoid(logits: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-logits))


def default_function(problem_type: str | None, num_labels: int) -> str:
    """transformers' rule: sigmoid for multi-label or single-output models, else softmax."""
    if problem_type == "multi_label_classification" or num_labels == 1:
        return "sigmoid"
    return "softmax"


def top_k_indices(scores: np.ndarray, k: int) -> np.ndarray:
    """The k highest scores' indices, highest first, ties to the lower index: exactly a stable
    argsort of -scores cut at k, without sorting the whole 30,522-entry vocabulary per [MASK]
    (a full sort was most of the event loop's time under load)."""
    if k >= len(scores):
        return np.argsort(-scores, kind="stable")
    kth_largest = np.partition(scores, len(scores) - k)[len(scores) - k]
    candidates = np.flatnonzero(scores >= kth_largest)  # ascending, so ties stay in index order
    return candidates[np.argsort(-scores[candidates], kind="stable")][:k]


def classification_scores(logits: np.ndarray, id2label: dict[int, str], function: str, top_k: int | None) -> list[dict]:
    if function == "softmax":
        scores = softmax(logits.astype(np.float64))
    elif function == "sigmoid":
        scores = sigmoid(logits.astype(np.float64))
    else:
        scores = logits.astype(np.float64)
    order = np.argsort(-scores, kind="stable")
    if top_k is not None:
        order = order[:top_k]
    return [{"label": id2label[int(i)], "score": float(scores[i])} for i in order]


def fill_mask_candidates(
    logits: np.ndarray,
    input_ids: np.ndarray,
    mask_position: int,
    tokenizer: RequestTokenizer,
    top_k: int,
    target_ids: list[int] | None,
    single_mask: bool = True,
) -> list[dict]:
    """Candidates for one [MASK]: probabilities over the whole vocabulary, then the top_k (of the
    targets, when given); `sequence` is the input with this mask filled, special tokens dropped,
    except with several masks, where (as transformers does) they are kept so the other [MASK]s show.
    The text around the mask is decoded once, not once per candidate (RequestTokenizer.filled_sequences)."""
    probs = softmax(logits.astype(np.float64))
    if target_ids is not None:
        candidates = np.asarray(target_ids)
        order = candidates[np.argsort(-probs[candidates], kind="stable")][:top_k]
    else:
        order = top_k_indices(probs, top_k)
    sequence = tokenizer.filled_sequences(input_ids, mask_position, skip_special_tokens=single_mask)
    return [
        {
            "sequence": sequence(int(token_id)),
            "score": float(probs[token_id]),
            "token": int(token_id),
            "token_str": tokenizer.decode([token_id], skip_special_tokens=False),
        }
        for token_id in order
    ]


def l2_normalize(vectors: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(vectors, axis=-1, keepdims=True)
    return vectors / np.maximum(norms, 1e-12)
