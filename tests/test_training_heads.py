"""The qa and tokens training stages (training/stages.py) on the small local files of tests/data/: data
reading and Hugging Face's label alignment, then a few steps on a tiny model that write a valid artifact
dir with held-out metrics in its card, which transformers loads as the right head."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import bigs_cli
from model.tokenizer import bert_uncased_tokenizer
from training.data.loaders import DataError
from training.data.spans import encode_qa, encode_tagged, read_squad, read_tagged
from training.metrics import entity_chunks, entity_f1, squad_scores

DATA = Path(__file__).parent / "data"


def test_squad_files_read_with_answers_at_their_stated_offsets():
    v1, v2 = read_squad(DATA / "squad-v1.json"), read_squad(DATA / "squad-v2.json")
    assert len(v1) == 17 and not any(e.is_impossible for e in v1)
    assert len(v2) == 11 and sum(e.is_impossible for e in v2) == 3
    for e in v1 + v2:
        for text, start in e.answers:
            assert e.context[start : start + len(text)] == text


def test_a_misplaced_answer_is_a_data_error(tmp_path):
    data = json.loads((DATA / "squad-v1.json").read_text())
    data["data"][0]["paragraphs"][0]["qas"][0]["answers"][0]["answer_start"] += 3
    (tmp_path / "bad.json").write_text(json.dumps(data))
    with pytest.raises(DataError, match="is not at"):
        read_squad(tmp_path / "bad.json")


def test_qa_labels_are_the_token_span_of_the_answer_and_cls_when_impossible_or_cut_off():
    tokenizer = bert_uncased_tokenizer()
    examples = read_squad(DATA / "squad-v2.json")
    encoded = encode_qa(examples, tokenizer, 64)
    for row, e in enumerate(examples):
        start, end = encoded.arrays["labels"][row]
        if e.is_impossible:
            assert (start, end) == (0, 0)
            continue
        offsets = encoded.offsets[row]
        assert start in encoded.context_rows[row] and end >= start
        assert e.context[offsets[start][0] : offsets[end][1]].lower() == e.answers[0][0].lower()
    # cut so that answers fall past the end: labelled [CLS], never a wrong span
    short = encode_qa(examples, tokenizer, 24)
    for row, e in enumerate(examples):
        start, end = short.arrays["labels"][row]
        offsets = short.offsets[row]
        if (start, end) != (0, 0):
            assert e.context[offsets[start][0] : offsets[end][1]].lower() == e.answers[0][0].lower()
    assert (short.arrays["labels"] == 0).all(axis=1).sum() > sum(e.is_impossible for e in examples)


@pytest.mark.parametrize("name", ["ner-conll.txt", "ner.jsonl"])
def test_tagged_files_label_the_first_word_piece_and_ignore_the_rest(name):
    sentences = read_tagged(DATA / name)
    assert len(sentences) == (10 if name.endswith(".txt") else 6)
    assert all(len(s.words) == len(s.tags) for s in sentences)
    tokenizer = bert_uncased_tokenizer()
    names = sorted({t for s in sentences for t in s.tags})
    label2id = {n: i for i, n in enumerate(names)}
    encoded = encode_tagged(sentences, tokenizer, 32, label2id)
    for row, s in enumerate(sentences):
        labels = encoded.arrays["labels"][row]
        word_ids = tokenizer([list(s.words)], is_split_into_words=True).word_ids(0)
        kept = [names[labels[i]] for i, w in enumerate(word_ids) if w is not None and labels[i] != -100]
        assert kept == list(s.tags)  # exactly one label per word, on its first piece
        assert labels[0] == -100 and (labels[encoded.arrays["attention_mask"][row] == 0] == -100).all()
    assert (encoded.arrays["labels"] == -100).sum() > 0


def test_squad_scores_normalise_as_the_official_script():
    scores = squad_scores(["The Granite", "in 1874", ""], [["granite"], ["1874"], [""]])
    assert scores["exact_match"] == pytest.approx(100 * 2 / 3)
    assert scores["f1"] == pytest.approx(100 * (1 + 2 / 3 + 1) / 3)


def test_entity_f1_counts_whole_entities():
    assert entity_chunks(["B-PER", "I-PER", "O", "B-LOC", "I-LOC", "B-LOC"]) == {
        ("PER", 0, 1),
        ("LOC", 3, 4),
        ("LOC", 5, 5),
    }
    gold = [["B-PER", "I-PER", "O", "B-LOC"]]
    assert entity_f1(gold, gold)["entity_f1"] == 1.0
    half = entity_f1(gold, [["B-PER", "O", "O", "B-LOC"]])  # the person's span is cut: wrong
    assert half["entity_f1"] == pytest.approx(0.5)


@pytest.fixture(scope="module")
def mlm_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("mlm") / "init"
    bigs_cli.main(["init", str(out), "--hidden-size", "64", "--layers", "2", "--max-length", "128"])
    return out


def train(stage: str, mlm_dir: Path, out: Path, *overrides: str) -> Path:
    bigs_cli.main(
        ["train", stage, f"init_from={mlm_dir}", f"output_dir={out}", "num_steps=4", "batch_size=4",
         "eval_every=2", "log_every=2", "checkpoint_every=4", "optim.warmup_steps=1", "data.seq_len=96",
         "progress=false", *overrides]
    )  # fmt: skip
    return out / "artifact"


@pytest.mark.slow
@pytest.mark.parametrize("source", ["squad-v1.json", "squad-v2.json"])
def test_qa_stage_writes_an_artifact_with_exact_match_and_f1(mlm_dir, tmp_path, source):
    import torch
    import transformers

    artifact = train("qa", mlm_dir, tmp_path / "run", f'data.sources=["{DATA / source}"]')
    card = json.loads((artifact / "training_card.json").read_text())
    assert card["stage"] == "qa" and card["steps"] == 4
    assert {"eval_exact_match", "eval_f1", "eval_loss"} <= set(card["held_out"])
    assert 0 <= card["held_out"]["eval_f1"] <= 100
    assert card["data"]["splits"]["validation"] >= 1 and card["data"]["split_by"] == "article"
    config = json.loads((artifact / "config.json").read_text())
    assert config["architectures"] == ["BiGSForQuestionAnswering"]
    import model  # noqa: F401

    loaded, info = transformers.AutoModelForQuestionAnswering.from_pretrained(artifact, output_loading_info=True)
    assert not info["unexpected_keys"] and all(k.startswith("bigs.pooler.") for k in info["missing_keys"])
    out = loaded(torch.ones(1, 8, dtype=torch.long))
    assert out.start_logits.shape == (1, 8) and np.isfinite(out.start_logits.detach().numpy()).all()


@pytest.mark.slow
@pytest.mark.parametrize("source", ["ner-conll.txt", "ner.jsonl"])
def test_tokens_stage_writes_an_artifact_with_entity_f1_and_its_labels(mlm_dir, tmp_path, source):
    eval_source = DATA / ("ner.jsonl" if source.endswith(".txt") else "ner-conll.txt")
    artifact = train(
        "tokens", mlm_dir, tmp_path / "run", f'data.sources=["{DATA / source}"]', f"data.eval_source={eval_source}"
    )
    card = json.loads((artifact / "training_card.json").read_text())
    assert card["stage"] == "tokens" and card["data"]["split_by"] == "file"
    assert {"eval_entity_f1", "eval_accuracy", "eval_loss"} <= set(card["held_out"])
    config = json.loads((artifact / "config.json").read_text())
    assert config["architectures"] == ["BiGSForTokenClassification"]
    assert set(config["id2label"].values()) == {"O", "B-PER", "I-PER", "B-LOC", "B-ORG", "I-ORG"}
    assert config["id2label"]["0"] == "O"


def test_stages_need_an_mlm_artifact_and_one_source():
    from training.config import load_config

    with pytest.raises(ValueError, match="needs init_from"):
        load_config(stage="qa")
    with pytest.raises(ValueError, match="one labelled source"):
        load_config(stage="tokens", init_from="x", overrides=['data.sources=["a","b"]'])
