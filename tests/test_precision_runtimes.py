"""The exported variants run through the service's runtimes answer as their gate allows.

- Padded = unpadded and batched = single within the gate (dynamic int8 quantizes activations per batch,
  so neither holds exactly).
- A runtime per bucket: int8 at one bucket and fp32 at another over one copy of the weights, bf16 (OpenVINO)
  at one and int8 (ORT) at another, int8-openvino and int8 on ORT sharing the weights; each bucket answers
  what its precision's runtime does, and a model served int8 holds only its int8 graphs' weights.
- int8-openvino is not measured on a CPU without int8 dot products, and says why.
"""

from __future__ import annotations

import numpy as np
import pytest
from precision_fixtures import VARIANT_BUCKETS, bf16_runs_here, int8_openvino_runs_here


def _runtime(export_dir, precision):
    from export.manifest import read_manifest
    from service.runtimes import load_runtime

    return load_runtime("onnx", export_dir, read_manifest(export_dir), precision=precision)


def _sequences(tokenizer, n: int, seed: int) -> list[list[int]]:
    from export.gate import gate_sequences

    pool = gate_sequences(tokenizer, 128)
    rng = np.random.default_rng(seed)
    return [pool[i] for i in rng.choice(len(pool), n, replace=False)]


def _batch(sequences: list[list[int]], bucket: int) -> dict[str, np.ndarray]:
    ids = np.zeros((len(sequences), bucket), np.int64)
    mask = np.zeros_like(ids)
    for row, seq in enumerate(sequences):
        ids[row, : len(seq)], mask[row, : len(seq)] = seq, 1
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}


def _within_gate(a: np.ndarray, b: np.ndarray, what: str) -> None:
    from export.gate import cosine
    from export.manifest import GateThresholds

    t = GateThresholds()
    if what == "embeddings":
        assert cosine(a, b).min() >= t.embedding_cosine_min, cosine(a, b)
    else:
        assert np.abs(a - b).max() <= t.max_abs_logit_diff_max, np.abs(a - b).max()
        assert np.mean(a.argmax(-1) == b.argmax(-1)) >= t.classification_agreement_min


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["int8", "bf16", "int8-openvino"])
def test_reduced_variants_keep_padded_equal_unpadded_and_batched_equal_single_within_the_gate(
    variant_exports, precision, tokenizer
):
    if precision == "bf16" and not bf16_runs_here():
        # Export records a bf16 variant only where OpenVINO really runs bf16 (AVX512_BF16 or AMX): on
        # another CPU there is no bf16 variant to hold to its gate.
        pytest.skip("this CPU has neither AVX512_BF16 nor AMX: export wrote no bf16 variant")
    if precision == "int8-openvino" and not int8_openvino_runs_here():
        pytest.skip("this CPU has no VNNI or AMX-INT8: export recorded no int8-openvino variant")
    runtime = _runtime(variant_exports["cls"], precision)
    assert runtime.precision == precision
    sequences = _sequences(tokenizer, 3, seed=0)
    for head in ("classification", "embeddings"):
        batched = runtime.run(head, 128, _batch(sequences, 128))
        padded = runtime.run(head, 512, _batch(sequences, 512))  # the same inputs, 384 more pad tokens
        single = np.concatenate([runtime.run(head, 128, _batch([s], 128)) for s in sequences])
        _within_gate(batched, single, head)
        _within_gate(batched, padded, head)


def _assert_each_bucket_answers_as_its_whole_model_runtime(mixed, whole: dict, sequences) -> None:
    """Every bucket of a per-bucket runtime answers exactly as the runtime of its precision for the whole model."""
    for head in ("classification", "embeddings"):
        for bucket, precision in mixed.precisions.items():
            got = mixed.run(head, bucket, _batch(sequences, bucket))
            np.testing.assert_array_equal(got, whole[precision].run(head, bucket, _batch(sequences, bucket)))


@pytest.mark.slow
def test_int8_at_one_bucket_and_fp32_at_another_run_each_buckets_own_graph_over_one_copy_of_the_weights(
    variant_exports, tokenizer
):
    from export.manifest import read_manifest
    from service.runtimes import load_runtime

    export_dir = variant_exports["cls"]
    mixed = load_runtime("onnx", export_dir, read_manifest(export_dir), precision={128: "int8", 512: "fp32"})
    assert (mixed.kind, mixed.precision, mixed.precisions) == ("onnx", "mixed", {128: "int8", 512: "fp32"})
    assert mixed.sessions[128].bigs_shared_weights is mixed.sessions[512].bigs_shared_weights
    whole = {p: _runtime(export_dir, p) for p in ("int8", "fp32")}
    sequences = _sequences(tokenizer, 3, seed=1)
    _assert_each_bucket_answers_as_its_whole_model_runtime(mixed, whole, sequences)
    for head in ("classification", "embeddings"):
        # the two buckets really run different graphs: int8 at 128 is not fp32's answer
        assert not np.array_equal(
            mixed.run(head, 128, _batch(sequences, 128)), whole["fp32"].run(head, 128, _batch(sequences, 128))
        )


@pytest.mark.slow
def test_bf16_on_openvino_at_one_bucket_and_int8_on_ort_at_another_are_one_runtime_sending_each_bucket_to_its_own(
    variant_exports, tokenizer
):
    if not bf16_runs_here():
        pytest.skip("this CPU has neither AVX512_BF16 nor AMX: export wrote no bf16 variant")
    _openvino_at_128_and_int8_at_512_are_one_runtime(variant_exports["cls"], "bf16", tokenizer, seed=2)


def _openvino_at_128_and_int8_at_512_are_one_runtime(export_dir, on_openvino: str, tokenizer, seed: int):
    """A model served `on_openvino` (bf16, int8-openvino) at 128 and int8 on ORT at 512: one runtime sending each
    bucket to its own, each answering exactly as that precision's runtime for the whole model, over one copy of
    the weights (OpenVINO's constants point into the arrays ORT runs on). Returns the sequences it sent."""
    from export.manifest import read_manifest
    from service.runtimes import PerBucketRuntime, load_runtime

    by_bucket = {128: on_openvino, 512: "int8"}
    mixed = load_runtime("onnx", export_dir, read_manifest(export_dir), precision=by_bucket)
    assert isinstance(mixed, PerBucketRuntime) and mixed.kind == "openvino+onnx"
    assert (mixed.precision, mixed.precisions, mixed.buckets) == ("mixed", by_bucket, [128, 512])
    whole = {p: _runtime(export_dir, p) for p in (on_openvino, "int8")}
    sequences = _sequences(tokenizer, 3, seed=seed)
    _assert_each_bucket_answers_as_its_whole_model_runtime(mixed, whole, sequences)
    assert mixed.of_bucket[128].compiled[128].weights is mixed.of_bucket[512].sessions[512].bigs_shared_weights
    return sequences


def test_int8_openvino_is_not_measured_on_a_cpu_without_int8_dot_products_and_says_why(exports, monkeypatch):
    # there OpenVINO would decompress the int8 weights instead of quantizing the activations: a gate measured so
    # would be of another computation, so export records no int8-openvino and says why (export/gate.py)
    import export.cpu
    from export.gate import VariantUnavailable, variant_runner
    from export.manifest import read_manifest

    monkeypatch.setattr(export.cpu, "has_exact_int8_products", lambda flags=None: False)
    export_dir = exports["cls"]
    with pytest.raises(VariantUnavailable, match="no VNNI or AMX-INT8, so OpenVINO would decompress"):
        variant_runner(export_dir, read_manifest(export_dir), "int8-openvino", [min(read_manifest(export_dir).buckets)])


@pytest.mark.slow
def test_int8_openvino_at_one_bucket_and_int8_on_ort_at_another_share_the_weights_and_answer_within_the_gate(
    variant_exports, tokenizer
):
    from export.manifest import read_manifest

    if not int8_openvino_runs_here():
        pytest.skip("this CPU has no VNNI or AMX-INT8: export recorded no int8-openvino variant")
    export_dir = variant_exports["cls"]
    manifest = read_manifest(export_dir)
    assert manifest.precisions["int8-openvino"].passed is not None
    assert set(manifest.latency.ms["int8-openvino"]) == set(VARIANT_BUCKETS)
    sequences = _openvino_at_128_and_int8_at_512_are_one_runtime(export_dir, "int8-openvino", tokenizer, seed=4)
    whole = {p: _runtime(export_dir, p) for p in ("int8-openvino", "fp32")}
    for head in ("classification", "embeddings"):  # int8 products: near fp32's answer, not fp32's answer
        got, reference = (whole[p].run(head, 128, _batch(sequences, 128)) for p in ("int8-openvino", "fp32"))
        _within_gate(got, reference, head)
        assert not np.array_equal(got, reference)


@pytest.mark.slow
def test_openvino_over_the_weights_ort_holds_swaps_every_weight_and_answers_exactly_as_from_the_file(
    variant_exports, tokenizer
):
    """OpenVINO's buckets compiled over the weights already in memory (not a copy of their own per bucket)
    hold no constant of the weights table of their own, and compute bit for bit what they compute from
    the file."""
    import onnx
    import openvino as ov

    from export.manifest import read_manifest
    from export.onnx_runtime import map_weights
    from export.openvino_runtime import load_compiled, share_weights

    precisions = ["fp32", "bf16"] if bf16_runs_here() else ["fp32"]
    for name, export_dir in variant_exports.items():
        manifest = read_manifest(export_dir)
        weights = map_weights(export_dir, manifest, in_memory=True)
        graph = export_dir / manifest.onnx.graph(128, "fp32").file
        in_table = [
            t.name for t in onnx.load(graph, load_external_data=False).graph.initializer if t.name in weights.arrays
        ]
        assert share_weights(ov.Core().read_model(str(graph)), weights.arrays) == len(in_table) > 0, name
        sequences = _sequences(tokenizer, 3, seed=3)
        for precision in precisions:
            own = load_compiled(export_dir, precision, buckets=[128], manifest=manifest)[128]
            shared = load_compiled(export_dir, precision, buckets=[128], manifest=manifest, weights=weights)[128]
            assert shared.weights is weights and own.weights is None
            feeds = _batch(sequences, 128)
            feeds["mask_positions"] = np.array([[1], [2], [3]])
            got, want = shared.run(feeds), own.run(feeds)
            for output in own.output_names:
                np.testing.assert_array_equal(got[output], want[output], err_msg=f"{name} {precision} {output}")


@pytest.mark.slow
def test_a_model_served_int8_holds_only_its_int8_graphs_weights_and_answers_as_over_the_whole_file(
    variant_exports, tokenizer
):
    """Served int8 at every bucket, a model reads none of the fp32 weights only its fp32 graphs use (its products'
    fp32 weights, a third to a half of the file for the defaults), and answers bit for bit as over the whole file."""
    from export.manifest import read_manifest
    from export.onnx_runtime import graph_weights, load_sessions, map_weights

    export_dir = variant_exports["cls"]
    manifest = read_manifest(export_dir)
    runtime = _runtime(export_dir, "int8")
    held = runtime.sessions[128].bigs_shared_weights
    int8_graphs = graph_weights(manifest, [(b, "int8") for b in manifest.buckets])
    assert set(held.arrays) == set(held.values) == int8_graphs
    fp32_only = graph_weights(manifest, [(b, "fp32") for b in manifest.buckets]) - int8_graphs
    assert fp32_only and not fp32_only & set(held.arrays)  # the fp32 products' weights: not read
    whole = load_sessions(export_dir, variant="int8", shared=map_weights(export_dir, manifest, in_memory=True))
    sequences = _sequences(tokenizer, 3, seed=5)
    for bucket, session in whole.items():
        (want,) = session.run(["embeddings"], _batch(sequences, bucket))
        np.testing.assert_array_equal(runtime.run("embeddings", bucket, _batch(sequences, bucket)), want)


@pytest.mark.slow
def test_int8_openvino_buckets_share_one_int8_copy_of_each_weight_let_its_fp32_go_and_answer_as_from_the_file(
    variant_exports, tokenizer
):
    """At int8-openvino every bucket's products read one int8 copy of each weight (made once, not per bucket), the
    fp32 weights it was made from are let go where no other graph of the model reads them, and each bucket answers
    bit for bit as its graph compiled from the file on its own; after warm-up's buffers are given back too."""
    from export.manifest import read_manifest
    from export.onnx_runtime import graph_weights
    from export.openvino_runtime import load_compiled
    from service.runtimes import release_memory

    if not int8_openvino_runs_here():
        pytest.skip("this CPU has no VNNI or AMX-INT8: export recorded no int8-openvino variant")
    export_dir = variant_exports["cls"]
    manifest = read_manifest(export_dir)
    runtime = _runtime(export_dir, "int8-openvino")
    first, second = (runtime.compiled[b] for b in VARIANT_BUCKETS[:2])
    assert first.int8_shared is second.int8_shared and first.weights is second.weights
    made_int8 = runtime.weights_made_int8()
    assert made_int8 and not made_int8 & set(first.weights.arrays)  # each made int8 once; its fp32 gone
    sequences = _sequences(tokenizer, 3, seed=6)
    feeds = {b: _batch(sequences, b) | {"mask_positions": np.array([[1], [2], [3]])} for b in VARIANT_BUCKETS}
    answers = {b: runtime.compiled[b].run(feeds[b]) for b in VARIANT_BUCKETS}
    release_memory(runtime)  # what warm-up ends with
    for bucket in VARIANT_BUCKETS:
        own = load_compiled(export_dir, "int8-openvino", buckets=[bucket], manifest=manifest)[bucket]
        want, again = own.run(feeds[bucket]), runtime.compiled[bucket].run(feeds[bucket])
        for output in own.output_names:
            np.testing.assert_array_equal(answers[bucket][output], want[output], err_msg=f"{bucket} {output}")
            np.testing.assert_array_equal(again[output], want[output], err_msg=f"{bucket} {output} after release")
    # beside int8 on ORT, a weight made int8 that the int8 graph reads in fp32 stays
    mixed = _runtime(export_dir, {128: "int8-openvino", 512: "int8", 1024: "int8"})
    held = set(mixed.of_bucket[512].sessions[512].bigs_shared_weights.arrays)
    int8_graphs = graph_weights(manifest, [(512, "int8"), (1024, "int8")])
    assert int8_graphs <= held and not (mixed.of_bucket[128].weights_made_int8() - int8_graphs) & held
    # warm-up's end gives back both runtimes' idle buffers (ORT's one arena shrunk by a short run): same answers
    before = {b: mixed.run("embeddings", b, _batch(sequences, b)) for b in VARIANT_BUCKETS}
    release_memory(mixed)
    for bucket in VARIANT_BUCKETS:
        np.testing.assert_array_equal(mixed.run("embeddings", bucket, _batch(sequences, bucket)), before[bucket])
