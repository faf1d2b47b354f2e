"""Export of the question-answering and token-classification heads (docs/DESIGN.md §1.4, §5.4): each
ONNX bucket and StableHLO artifact equals the torch model on full and padded batches, the manifest
names the heads (and the token labels), and `bigs export --verify` re-measures the same.

A tiny QA model and a tiny token classifier (2 layers, hidden 64, 1,024 positions, one slowly decaying
SSM as in tests/test_export.py) are exported to buckets 128 (Toeplitz) and 1024 (chunked).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from test_export import TOLERANCE, cli, make_model, padded_inputs, run_onnx, scaled_error

from export.onnx_runtime import load_sessions
from export.stablehlo_runtime import load_stablehlo
from model import BiGSForQuestionAnswering, BiGSForTokenClassification
from model.modeling_bigs import mean_pool

BUCKETS = [128, 1024]
TAGS = {0: "O", 1: "B-PER", 2: "I-PER", 3: "B-LOC", 4: "I-LOC"}
HEAD_OF = {BiGSForQuestionAnswering: "question-answering", BiGSForTokenClassification: "token-classification"}


@torch.no_grad()
def per_token_reference(model, feeds):
    """(B, L, 2) start/end logits or (B, L, num_labels), and embeddings (B, d), FFT formulation."""
    ids, mask, types = (torch.from_numpy(feeds[k]) for k in ("input_ids", "attention_mask", "token_type_ids"))
    out = model(ids, attention_mask=mask, token_type_ids=types, output_hidden_states=True)
    if isinstance(model, BiGSForQuestionAnswering):
        logits = torch.stack([out.start_logits, out.end_logits], -1)
    else:
        logits = out.logits
    return logits.numpy(), mean_pool(out.hidden_states[-1], mask).numpy()


@pytest.fixture(scope="module", params=[BiGSForQuestionAnswering, BiGSForTokenClassification], ids=lambda c: HEAD_OF[c])
def exported(request, tmp_path_factory):
    cls = request.param
    labels = (
        {"id2label": TAGS, "label2id": {v: k for k, v in TAGS.items()}} if cls is BiGSForTokenClassification else {}
    )
    model = make_model(cls, seed=3, **labels)
    artifact = tmp_path_factory.mktemp("heads_artifact")
    model.save_pretrained(artifact)
    out = tmp_path_factory.mktemp("heads_export")
    assert cli("export", str(artifact), str(out), "--buckets", ",".join(map(str, BUCKETS)), "--precisions", "none") == 0
    return model, out, json.loads((out / "manifest.json").read_text())


@pytest.mark.slow
def test_manifest_names_the_head_and_records_passed_parity(exported):
    model, _, manifest = exported
    head = HEAD_OF[type(model)]
    assert manifest["heads"] == [head, "embeddings"]
    assert manifest["parity"]["passed"] and not manifest["parity"]["breaches"]
    width = 2 if head == "question-answering" else len(TAGS)
    assert manifest["labels"] == ({str(k): v for k, v in TAGS.items()} if width == len(TAGS) else None)
    for bucket in BUCKETS:
        entry = manifest["onnx"]["buckets"][str(bucket)]
        assert [o["name"] for o in entry["outputs"]] == ["logits", "embeddings"]
        assert entry["outputs"][0]["shape"][1:] == [bucket, width]
        assert set(manifest["stablehlo"]["heads"]) == {head, "embeddings"}


@pytest.mark.slow
def test_onnx_and_stablehlo_equal_torch_on_full_and_padded_batches(exported):
    model, out, _ = exported
    head = HEAD_OF[type(model)]
    sessions = load_sessions(out)
    for bucket in BUCKETS:
        for lengths in ([bucket], [bucket, bucket // 2 + 1, 9, 1]):
            feeds = padded_inputs(lengths, bucket, model.config.vocab_size, seed=bucket + len(lengths))
            logits, embeddings = per_token_reference(model, feeds)
            got_logits, got_embeddings = run_onnx(sessions[bucket], feeds)
            assert got_logits.shape == logits.shape
            assert scaled_error(got_logits, logits) < TOLERANCE, bucket
            assert scaled_error(got_embeddings, embeddings) < TOLERANCE, bucket
            base = (feeds["input_ids"], feeds["attention_mask"], feeds["token_type_ids"])
            hlo = load_stablehlo(out, head, bucket)(*base)["logits"]
            assert scaled_error(hlo, logits) < TOLERANCE, bucket


@pytest.mark.slow
def test_padding_inside_the_export_changes_no_real_token_output(exported):
    """A sequence alone in bucket 128 and padded into bucket 1024 gets the same outputs at its tokens."""
    model, out, _ = exported
    sessions = load_sessions(out)
    short = padded_inputs([100], 128, model.config.vocab_size, seed=5)
    long = {k: np.pad(v, ((0, 0), (0, 1024 - 128))) if k != "mask_positions" else v for k, v in short.items()}
    alone, _ = run_onnx(sessions[128], short)
    padded, _ = run_onnx(sessions[1024], long)
    assert scaled_error(padded[:, :100], alone[:, :100]) < TOLERANCE


@pytest.mark.slow
def test_verify_re_measures_the_head_export(exported, capsys):
    _, out, _ = exported
    assert cli("export", "--verify", str(out)) == 0
