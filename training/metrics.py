"""Held-out classification metrics: accuracy, macro F1, Matthews correlation (multi-class)."""

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
