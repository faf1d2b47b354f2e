"""Held-out metrics: classification (accuracy, macro F1, Matthews correlation), extractive QA (SQuAD exact
match and F1) and token classification (entity-level F1)."""

from __future__ import annotations

import numpy as np


def confusion_matrix(labels: np.ndarray, predictions: np.ndarray, num_labels: int) -> np.ndarray:
    matrix = np.zeros((num_labels, num_labels), dtype=np.int64)
    np.add.at(matrix, (labels, predictions), 1)
    return matrix


def classification_report(labels: np.ndarray, predictions: np.ndarray, num_labels: int) -> dict[str, float]:
    labels, predictions = np.asarray(labels), np.asarray(predictions)
    keep = labels >= 0
    labels, predictions = labels[keep], predictions[keep]
    matrix = confusion_matrix(labels, predictions, num_labels)
    true_positive = np.diag(matrix).astype(np.float64)
    predicted, actual = matrix.sum(axis=0), matrix.sum(axis=1)
    precision = np.divide(true_positive, predicted, out=np.zeros(num_labels), where=predicted > 0)
    recall = np.divide(true_positive, actual, out=np.zeros(num_labels), where=actual > 0)
    denom = precision + recall
    f1 = np.divide(2 * precision * recall, denom, out=np.zeros(num_labels), where=denom > 0)
    present = actual > 0
    # Matthews correlation, multi-class (Gorodkin's R_K).
    n = matrix.sum()
    correct = true_positive.sum()
    cov_ytyp = correct * n - predicted @ actual
    cov_ypyp = n * n - predicted @ predicted
    cov_ytyt = n * n - actual @ actual
    mcc = cov_ytyp / np.sqrt(cov_ytyt * cov_ypyp) if cov_ytyt > 0 and cov_ypyp > 0 else 0.0
    return {
        "accuracy": float(correct / max(n, 1)),
        "f1_macro": float(f1[present].mean()) if present.any() else 0.0,
        "mcc": float(mcc),
    }


def majority_baseline(train_labels: np.ndarray, eval_labels: np.ndarray, num_labels: int) -> dict[str, float]:
    """What always answering the most frequent training class scores on the held-out labels."""
    majority = int(np.bincount(np.asarray(train_labels), minlength=num_labels).argmax())
    return classification_report(eval_labels, np.full_like(np.asarray(eval_labels), majority), num_labels)


# ------------------------------------------------------------------------------------------
# Extractive QA: SQuAD's exact match and F1 (its evaluation script's normalisation)
# ------------------------------------------------------------------------------------------


def squad_normalize(text: str) -> str:
    """Lower case, no punctuation, no articles (a, an, the), single spaces: SQuAD's `normalize_answer`."""
    import re
    import string

    text = "".join(ch for ch in text.lower() if ch not in set(string.punctuation))
    return " ".join(re.sub(r"\b(a|an|the)\b", " ", text).split())


def squad_f1(prediction: str, gold: str) -> float:
    from collections import Counter

    predicted, expected = squad_normalize(prediction).split(), squad_normalize(gold).split()
    if not predicted or not expected:  # an impossible question: right only when both are empty
        return float(predicted == expected)
    common = sum((Counter(predicted) & Counter(expected)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(predicted), common / len(expected)
    return 2 * precision * recall / (precision + recall)


def squad_scores(predictions: list[str], golds: list[list[str]]) -> dict[str, float]:
    """Mean over questions of the best exact match and F1 against any gold answer ([""] when impossible)."""
    exact = [
        max(float(squad_normalize(p) == squad_normalize(g)) for g in gs)
        for p, gs in zip(predictions, golds, strict=True)
    ]
    f1 = [max(squad_f1(p, g) for g in gs) for p, gs in zip(predictions, golds, strict=True)]
    n = max(len(predictions), 1)
    return {"exact_match": 100.0 * sum(exact) / n, "f1": 100.0 * sum(f1) / n}


# ------------------------------------------------------------------------------------------
# Token classification: entity-level F1 (as seqeval's default, IOB2 / IOB1 / IO tags)
# ------------------------------------------------------------------------------------------


def entity_chunks(tags: list[str]) -> set[tuple[str, int, int]]:
    """(type, first word, last word) of each entity: "B-X" starts one, "I-X" continues an X (or starts one
    after anything else), a tag without a prefix is its own type, "O" is outside."""
    chunks, current = set(), None
    for i, tag in enumerate([*tags, "O"]):
        prefix, _, kind = tag.partition("-") if tag[:2] in ("B-", "I-") else ("I", "", tag)
        if tag == "O" or prefix == "B" or current is None or current[0] != kind:
            if current is not None:
                chunks.add((current[0], current[1], i - 1))
            current = None if tag == "O" else (kind, i)
    return chunks


def entity_f1(gold: list[list[str]], predicted: list[list[str]]) -> dict[str, float]:
    """Micro precision, recall and F1 over entities of all sentences (word-level tags)."""
    true_positive = n_predicted = n_gold = 0
    for g, p in zip(gold, predicted, strict=True):
        expected, found = entity_chunks(g), entity_chunks(p)
        true_positive += len(expected & found)
        n_predicted += len(found)
        n_gold += len(expected)
    precision = true_positive / n_predicted if n_predicted else 0.0
    recall = true_positive / n_gold if n_gold else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"entity_precision": precision, "entity_recall": recall, "entity_f1": f1}
