"""The compiled-model cache (`cache_dir`, service/compiled_cache.py): OpenVINO's compiled buckets kept between starts.

- A load with an empty cache compiles its OpenVINO buckets into it; the next load reads every one back and answers
  bit-identically, as a load without the cache does, at both of OpenVINO's precisions.
- Another export (a graph hash changed in its manifest) or another CPU has a directory of its own: nothing is read.
- A cache dir that cannot be written: the load goes on without it, with one warning.
- Through the service: with `cache_dir` set, a start writes it and the next start reads it (slow: the variant exports).

Real runtimes over the tiny service models (tests/service_fixtures.py; fp32 exports, which OpenVINO compiles at bf16
and int8-openvino as the service does).
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
from precision_fixtures import _tampered_copy, openvino_precision_here

# OpenVINO at two buckets (each of its precisions), ONNX Runtime at the third: a model's runtimes as precision auto mixes them
MIXED = {128: "bf16", 512: "int8-openvino", 1024: "fp32"}


def _load(export_dir, cache_dir, precision=MIXED):
    from export.manifest import read_manifest
    from service.runtimes import load_runtime

    return load_runtime("onnx", export_dir, read_manifest(export_dir), precision=precision, cache_dir=cache_dir)


def _read_back(runtime) -> list[int]:
    """The buckets its OpenVINO parts (one per precision, in a runtime per bucket) read from the cache."""
    parts = {id(p): p for p in getattr(runtime, "of_bucket", {0: runtime}).values()}.values()
    return sorted(b for p in parts if p.kind == "openvino" for b in p.from_cache)


def _answers(runtime) -> dict[tuple[str, int], np.ndarray]:
    """Every head at every bucket on the same two random inputs, one of them padded."""
    from export.heads import MASK_POSITIONS, signature

    rng = np.random.default_rng(0)
    answers = {}
    for bucket in runtime.buckets:
        ids = rng.integers(1000, 30000, (2, bucket), dtype=np.int64)
        mask = np.ones_like(ids)
        mask[1, bucket // 2 :] = 0
        inputs = {"input_ids": ids * mask, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
        for head in runtime.heads:
            feeds = dict(inputs)
            if signature(head).takes_positions:
                feeds[MASK_POSITIONS] = np.array([[3], [5]], np.int64)
            answers[head, bucket] = runtime.run(head, bucket, feeds)
    return answers


def _blobs(cache_dir) -> set:
    return {path.relative_to(cache_dir) for path in cache_dir.rglob("*.blob")}


def test_a_load_writes_the_cache_and_the_next_reads_every_bucket_back_with_identical_answers(exports, tmp_path):
    cache = tmp_path / "cache"
    first = _load(exports["cls"], cache)
    assert _read_back(first) == []
    written = _blobs(cache)
    assert len(written) == 2, written  # one per OpenVINO bucket, none for ONNX Runtime's
    (folder,) = {path.parent for path in written}
    assert folder.parts[0] == "openvino" and len(folder.parts) == 3  # openvino/<CPU>/<export>

    second = _load(exports["cls"], cache)
    assert _read_back(second) == [128, 512]
    assert _blobs(cache) == written
    uncached = _load(exports["cls"], None)
    reference, first_answers, second_answers = _answers(uncached), _answers(first), _answers(second)
    for key, expected in reference.items():
        np.testing.assert_array_equal(first_answers[key], expected, err_msg=str(key))
        np.testing.assert_array_equal(second_answers[key], expected, err_msg=str(key))


def test_another_export_or_another_cpu_reads_nothing_of_this_ones(exports, tmp_path):
    from export.cpu import cpu_flags, cpu_model_name
    from export.manifest import read_manifest
    from service.compiled_cache import cpu_key, openvino_cache_dir, this_cpu_key

    cache = tmp_path / "cache"
    _load(exports["cls"], cache, {128: "bf16", 512: "fp32", 1024: "fp32"})

    # the same graphs, but a manifest that records another hash of one of them: another export
    def other_graph_hash(manifest):
        manifest.onnx.buckets[512].sha256 = "0" * 64

    changed = _tampered_copy(exports["cls"], tmp_path, other_graph_hash)
    runtime = _load(changed, cache, {128: "bf16", 512: "fp32", 1024: "fp32"})
    assert _read_back(runtime) == []
    assert len({path.parent for path in _blobs(cache)}) == 2  # a directory per export

    manifest = read_manifest(exports["cls"])
    here = openvino_cache_dir(cache, manifest)
    assert here == openvino_cache_dir(cache, manifest, this_cpu_key())
    assert any(here.glob("*.blob"))
    without_bf16 = cpu_key(cpu_model_name(), cpu_flags() ^ {"avx512_bf16"}, "2026.4.1")
    elsewhere = openvino_cache_dir(cache, manifest, without_bf16)
    assert elsewhere != here and not any(elsewhere.glob("*.blob"))
    assert cpu_key("Other CPU", cpu_flags(), "2026.4.1") != cpu_key(cpu_model_name(), cpu_flags(), "2026.4.1")


def test_a_cache_dir_that_cannot_be_written_is_skipped_with_one_warning(exports, tmp_path, caplog):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    unwritable = blocker / "cache"  # under a regular file: no one can create it, root included
    with caplog.at_level(logging.WARNING, logger="bigs"):
        runtime = _load(exports["cls"], unwritable, {128: "bf16", 512: "fp32", 1024: "fp32"})
        _load(exports["cls"], unwritable, {128: "bf16", 512: "fp32", 1024: "fp32"})
    assert _read_back(runtime) == []
    warnings = [r.getMessage() for r in caplog.records if r.name == "bigs" and r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "cannot be written" in warnings[0], warnings
    reference = _answers(_load(exports["cls"], None, {128: "bf16", 512: "fp32", 1024: "fp32"}))
    for key, answer in _answers(runtime).items():
        np.testing.assert_array_equal(answer, reference[key], err_msg=str(key))


def test_unset_writes_nothing(exports, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    runtime = _load(exports["cls"], "", {128: "bf16", 512: "fp32", 1024: "fp32"})
    assert _read_back(runtime) == [] and not any(tmp_path.rglob("*.blob"))


@pytest.mark.slow
def test_with_cache_dir_set_a_start_writes_it_and_the_next_start_reads_it(variant_exports, tmp_path):
    from service.settings import ServiceSettings
    from service.state import ServiceState

    precision = openvino_precision_here()
    settings = ServiceSettings(
        models=[f"cls={variant_exports['cls']}"], precision=precision, cache_dir=str(tmp_path / "cache")
    )
    starts, answers = [], []
    for _ in range(2):
        state = ServiceState(settings)
        state.load()
        starts.append(state.models["cls"].runtime)
        answers.append(_answers(starts[-1]))  # every bucket run: the long lane's are compiled at their first run
    first, second = starts
    assert first.kind == "openvino" and first.from_cache == []
    assert second.from_cache == second.buckets
    for key, expected in answers[0].items():
        np.testing.assert_array_equal(answers[1][key], expected, err_msg=str(key))
