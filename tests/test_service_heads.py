"""The question-answering and token-classification routes end to end (docs/DESIGN.md §4.8): `bigs serve` in a
subprocess over tiny exported models, answers equal to transformers on the same weights.

Models: a tiny QA model and a tiny 7-label token classifier (hidden 64, 2 layers, the real BERT vocab, 4,096
positions, weights drawn wide as in tests/service_fixtures.py), exported to ONNX at buckets 128, 512, 4096.

- Token classification equals `transformers.pipeline("token-classification", aggregation_strategy=…)` for
  every strategy.
- Question answering: transformers 5 has no question-answering pipeline any more (it was removed from
  `transformers.pipelines`); its span decoding lives on as `select_starts_ends` / `decode_spans` in the
  document-question-answering pipeline. The reference here is the removed pipeline's path with those
  functions: its tokenization (question first, `only_second`, 384-token windows with stride 128, p_mask),
  the torch model, `select_starts_ends`, word-aligned offsets and merging of equal answers. Contexts fit in
  one 384 window, so the pipeline's stride cannot differ; a 4,096-token context is shown answered in one pass.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest

for _needed in ("torch", "transformers", "onnxruntime", "fastapi", "uvicorn"):
    pytest.importorskip(_needed)

from service_fixtures import ROOT, Server, _clean_env, _tail, assert_error, assert_same  # noqa: E402

pytestmark = pytest.mark.slow

MAX_LENGTH = 4096
BUCKETS = [128, 512, 4096]
TAGS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC", "B-ORG", "I-ORG"]
TOL = 1e-4
CONTEXT = (
    "The lighthouse on the northern cape was built in 1874 from granite quarried nearby. Its lamp was first "
    "fuelled by whale oil, then by kerosene, and it was electrified in 1931. Ada Brennan, the last keeper, "
    "lived in the cottage beside the tower until the light was automated in 1968."
)
QUESTIONS = ["When was the lighthouse built?", "Who was the last keeper?", "What fuelled the lamp first?"]
SENTENCES = [
    "Ada Brennan founded the Millbay chess club with Northwind Shipping.",
    "Maria Lopez flew from Lisbon to Dublin on Tuesday, then visited Delft University.",
    "Unbelievably, Chen Wei's café sells sourdough bread.",
]


def _artifact(out_dir: Path, task: str, seed: int) -> Path:
    import torch

    from model import BiGSConfig, BiGSForQuestionAnswering, BiGSForTokenClassification
    from model.tokenizer import save_tokenizer

    fields = dict(vocab_size=30522, hidden_size=64, num_hidden_layers=2, intermediate_size=192,
                  max_position_embeddings=MAX_LENGTH, initializer_range=0.12, hidden_dropout_prob=0.0)  # fmt: skip
    if task == "tokens":
        fields.update(id2label=dict(enumerate(TAGS)), label2id={t: i for i, t in enumerate(TAGS)})
    torch.manual_seed(seed)
    model = (BiGSForQuestionAnswering if task == "qa" else BiGSForTokenClassification)(BiGSConfig(**fields)).eval()
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or name.endswith("LayerNorm.weight"):
                p.add_(0.05 * torch.randn(p.shape, generator=g))
        head = model.qa_outputs if task == "qa" else model.classifier
        head.weight.mul_(8.0)  # peaked scores: ranks far apart, not a near-tie at every position
    model.save_pretrained(out_dir)
    save_tokenizer(out_dir, model_max_length=MAX_LENGTH)
    return out_dir


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("head-models")
    arts = {"qa": _artifact(root / "art-qa", "qa", 5), "tokens": _artifact(root / "art-tokens", "tokens", 6)}
    procs = {}
    for name, art in arts.items():
        cmd = [sys.executable, "-m", "bigs_cli", "export", str(art), str(root / f"export-{name}"),
               "--buckets", ",".join(map(str, BUCKETS)), "--formats", "onnx", "--precisions", "none"]  # fmt: skip
        log = root / f"export-{name}.log"
        procs[name] = subprocess.Popen(cmd, cwd=ROOT, stdout=log.open("w"), stderr=subprocess.STDOUT, env=_clean_env())
    for name, proc in procs.items():
        assert proc.wait(timeout=900) == 0, _tail(root / f"export-{name}.log")
        assert json.loads((root / f"export-{name}" / "manifest.json").read_text())["parity"]["passed"]
    return {**arts, "export-qa": root / "export-qa", "export-tokens": root / "export-tokens"}


@pytest.fixture(scope="module")
def client(models, tmp_path_factory):
    server = Server({"qa": models["export-qa"], "tagger": models["export-tokens"]}, tmp_path_factory.mktemp("logs"))
    try:
        server.wait_ready()
        with httpx.Client(base_url=server.url, timeout=120) as http:
            yield http
    finally:
        server.stop()


@pytest.fixture(scope="module")
def reference(models):
    import transformers

    import model  # noqa: F401  (registers BiGS with the Auto classes)

    qa = transformers.AutoModelForQuestionAnswering.from_pretrained(models["qa"], ssm_formulation="fft").eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(models["qa"])
    return {"qa": qa, "tokenizer": tokenizer, "tagger": str(models["tokens"])}


def transformers_qa(model, tokenizer, question, context, top_k=1, max_answer_len=15,
                    handle_impossible_answer=False, max_seq_len=384):  # fmt: skip
    """The question-answering pipeline of transformers 4 on one input, with transformers' own decoding."""
    import torch
    from transformers.pipelines.document_question_answering import select_starts_ends

    enc = tokenizer(question, context, truncation="only_second", max_length=max_seq_len,
                    stride=min(max_seq_len // 2, 128), return_overflowing_tokens=True, return_offsets_mapping=True,
                    return_token_type_ids=True, return_special_tokens_mask=True)  # fmt: skip
    assert len(enc["input_ids"]) == 1, "the context must fit in one window"
    p_mask = np.array([s != 1 for s in enc.sequence_ids(0)], dtype=np.int64)
    p_mask[np.array(enc["input_ids"][0]) == tokenizer.cls_token_id] = 0
    with torch.no_grad():
        out = model(**{k: torch.tensor(enc[k]) for k in ("input_ids", "attention_mask", "token_type_ids")})
    attention = np.array(enc["attention_mask"])
    starts, ends, scores, null = select_starts_ends(
        out.start_logits.numpy(), out.end_logits.numpy(), p_mask, attention, 1000000, top_k * 2 + 10,
        handle_impossible_answer, max_answer_len,
    )  # fmt: skip
    encoding, answers = enc[0], []
    for s, e, score in zip(starts, ends, scores, strict=True):
        try:
            first = encoding.word_to_chars(encoding.token_to_word(s), sequence_index=1)[0]
            last = encoding.word_to_chars(encoding.token_to_word(e), sequence_index=1)[1]
        except Exception:
            first, last = encoding.offsets[s][0], encoding.offsets[e][1]
        text = context[first:last]
        same = next((a for a in answers if a["answer"].lower() == text.lower()), None)
        if same:
            same["score"] += score.item()
        else:
            answers.append({"score": score.item(), "start": first, "end": last, "answer": text})
    if handle_impossible_answer:
        answers.append({"score": null, "start": 0, "end": 0, "answer": ""})
    answers = sorted(answers, key=lambda a: a["score"], reverse=True)[:top_k]
    return answers[0] if len(answers) == 1 else answers


QA_CASES = {
    "top1": {},
    "top3-short": {"top_k": 3, "max_answer_len": 4},
    "impossible": {"top_k": 2, "handle_impossible_answer": True},
}


@pytest.mark.parametrize("case", list(QA_CASES))
def test_question_answering_equals_transformers_qa_on_the_same_weights(client, reference, case):
    params = QA_CASES[case]
    for question in QUESTIONS:
        body = {"inputs": {"question": question, "context": CONTEXT}, "parameters": params}
        response = client.post("/v1/question-answering", json=body)
        assert response.status_code == 200, response.text
        want = transformers_qa(reference["qa"], reference["tokenizer"], question, CONTEXT, **params)
        assert_same(response.json(), want, TOL)


@pytest.mark.parametrize("strategy", ["none", "simple", "first", "average", "max"])
def test_token_classification_equals_the_pipeline_for_every_aggregation(client, reference, strategy):
    from transformers import pipeline

    import model  # noqa: F401

    tagger = pipeline("token-classification", model=reference["tagger"], aggregation_strategy=strategy)
    want = [[{k: (float(v) if k == "score" else int(v) if k in ("start", "end", "index") else v)
              for k, v in e.items()} for e in tagger(text)] for text in SENTENCES]  # fmt: skip
    response = client.post(
        "/v1/token-classification", json={"inputs": SENTENCES, "parameters": {"aggregation_strategy": strategy}}
    )
    assert response.status_code == 200, response.text
    assert sum(map(len, want)) > 0  # something to compare
    assert_same(response.json(), want, TOL)
    one = client.post(
        "/v1/token-classification", json={"inputs": SENTENCES[0], "parameters": {"aggregation_strategy": strategy}}
    )
    assert_same(one.json(), want[0], TOL)  # one input: one list


def test_ignore_labels_empty_returns_every_token_with_offsets_into_the_text(client):
    text = SENTENCES[2]
    got = client.post("/v1/token-classification", json={"inputs": text, "parameters": {"ignore_labels": []}}).json()
    assert [e["index"] for e in got] == list(range(1, len(got) + 1))  # every token but [CLS], [SEP]
    for e in got:
        assert e["entity"] in TAGS
        piece = text[e["start"] : e["end"]].lower()
        assert e["word"].removeprefix("##") == piece or e["word"] == "[UNK]" or piece.startswith("caf")


def test_a_4096_token_context_is_answered_in_one_forward_pass(client, reference):
    """No windows: the whole context is one input of the 4,096 bucket, and the answer is the one a single
    forward pass over all of it gives."""
    tokenizer = reference["tokenizer"]
    question = QUESTIONS[1]
    sentences = [CONTEXT] * 60
    context = " ".join(sentences)
    n = len(tokenizer(question, context)["input_ids"])
    while n > MAX_LENGTH:
        sentences.pop()
        context = " ".join(sentences)
        n = len(tokenizer(question, context)["input_ids"])
    assert n > 3500
    response = client.post("/v1/question-answering", json={"inputs": {"question": question, "context": context},
                                                             "parameters": {"top_k": 3}})  # fmt: skip
    assert response.status_code == 200, response.text
    assert response.headers["x-compute-tokens"] == str(MAX_LENGTH)  # one row of the 4,096 bucket
    want = transformers_qa(reference["qa"], tokenizer, question, context, top_k=3, max_seq_len=MAX_LENGTH)
    assert_same(response.json(), want, TOL)


def test_batched_and_padded_questions_get_the_answers_they_get_alone(client):
    """Inputs of different lengths in one request (padded to their buckets, batched) answer as one by one."""
    contexts = [CONTEXT, CONTEXT[:120], " ".join([CONTEXT] * 4)]
    items = [{"question": q, "context": c} for q in QUESTIONS for c in contexts]
    together = client.post("/v1/question-answering", json={"inputs": items, "parameters": {"top_k": 2}})
    assert together.status_code == 200, together.text
    alone = [client.post("/v1/question-answering", json={"inputs": item, "parameters": {"top_k": 2}}).json()
             for item in items]  # fmt: skip
    assert_same(together.json(), alone, 1e-5)


def test_too_long_context_is_413_unless_truncated_and_bad_input_is_422(client):
    long = " ".join([CONTEXT] * 120)
    item = {"question": QUESTIONS[0], "context": long}
    assert_error(client.post("/v1/question-answering", json={"inputs": item}), 413, "too_long")
    cut = client.post("/v1/question-answering", json={"inputs": item, "parameters": {"truncate": True}})
    assert cut.status_code == 200 and cut.json()["answer"] in long
    for body in (
        {"inputs": {"question": "x"}},
        {"inputs": {"question": " ", "context": "a"}},
        {"inputs": []},
        {"inputs": {"question": "a", "context": "b"}, "parameters": {"top_k": 0}},
        {"inputs": {"question": "a", "context": "b"}, "parameters": {"max_answer_len": "5"}},
    ):
        assert_error(client.post("/v1/question-answering", json=body), 422)
    assert_error(client.post("/v1/token-classification", json={"inputs": long * 2}), 413, "too_long")
    for body in ({"inputs": "a", "parameters": {"aggregation_strategy": "mean"}}, {"inputs": ""}, {"inputs": 3}):
        assert_error(client.post("/v1/token-classification", json=body), 422)
    assert_error(client.post("/v1/question-answering", json={"inputs": item, "model": "tagger"}), 400)


def test_models_lists_the_new_tasks_and_the_tag_labels(client):
    cards = {c["id"]: c for c in client.get("/v1/models").json()["data"]}
    assert cards["qa"]["tasks"] == ["question-answering", "embeddings"]
    assert cards["tagger"]["tasks"] == ["token-classification", "embeddings"]
    assert cards["tagger"]["labels"] == TAGS


def test_the_new_routes_keep_their_openapi_contract_under_generated_requests(client):
    """tests/test_fuzz.py's checks (no 5xx, declared statuses, content types, headers and response schemas,
    invalid data refused) on the two routes, against models that serve them (valid requests answer 200)."""
    from collections import Counter

    import schemathesis
    from schemathesis import GenerationMode
    from test_fuzz import fuzz

    schema = schemathesis.openapi.from_url(f"{client.base_url}/openapi.json")
    statuses: Counter[int] = Counter()
    failures, sent = [], 0
    for operation in (result.ok() for result in schema.get_all_operations()):
        if operation.path not in ("/v1/question-answering", "/v1/token-classification"):
            continue
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            try:
                sent += fuzz(operation, mode, str(client.base_url), statuses)
            except Exception as failure:
                failures.append(f"{operation.path} ({mode.value}): {failure}")
    assert not failures, "\n\n".join(failures)
    assert sent >= 150 and statuses[200] > 20, statuses
