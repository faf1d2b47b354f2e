"""The held-out cloze set (training/heldout/cloze-en.jsonl) is held out: no sentence, with any of its
answers in place of [MASK], occurs in any text the project trains on (every registry source, labelled
ones included, since their texts are read as plain text too), compared lowercased with whitespace
collapsed and the spaces around punctuation ignored. And every answer is one token of the vocabulary,
so a top-5 hit is a single prediction."""

from __future__ import annotations

import re

import pytest

from model.tokenizer import bert_uncased_tokenizer
from training.data.sources import SOURCES, load_source
from training.evaluation import read_cloze


def canonical(text: str) -> str:
    text = re.sub(r"\s+", " ", text.lower())
    return re.sub(r"\s*([.,;:!?'\"])\s*", r"\1", text).strip()


def test_the_set_has_at_least_100_sentences_each_with_one_mask_and_single_token_answers():
    items = read_cloze()
    assert len(items) >= 100
    vocab = bert_uncased_tokenizer().get_vocab()
    for item in items:
        assert item.text.count("[MASK]") == 1, item.text
        assert item.answers and all(a in vocab for a in item.answers), item
    assert len({i.text for i in items}) == len(items)


@pytest.mark.slow
@pytest.mark.parametrize("source", sorted(SOURCES))
def test_no_cloze_sentence_occurs_in_a_training_source(source):
    filled = {
        canonical(item.text.replace("[MASK]", answer)): item.text for item in read_cloze() for answer in item.answers
    }
    found = set()
    for document in load_source(source):
        text = canonical(document.text)
        found |= {original for sentence, original in filled.items() if sentence in text}
    assert not found, f"{source} holds {sorted(found)}"
