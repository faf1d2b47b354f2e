"""Postprocessing invariants: the partial top-k equals a full stable sort, ties included."""

import numpy as np
import pytest

from service.postprocess import top_k_indices


@pytest.mark.parametrize("k", [1, 2, 5, 17, 100, 999, 1000, 1500])
def test_top_k_equals_full_stable_sort(k):
    rng = np.random.default_rng(k)
    for scores in (
        rng.normal(size=1000),
        rng.integers(0, 7, size=1000).astype(np.float64),  # many ties, also across the k-th place
        np.zeros(1000),
    ):
        expected = np.argsort(-scores, kind="stable")[:k]
        np.testing.assert_array_equal(top_k_indices(scores, k), expected)
