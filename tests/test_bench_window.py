"""The GPU window's one call (bench/window.py), run on the CPU at a tiny size: what `pack` puts in the
bundle, what `train` ships back, and what `unpack` makes of it. The command is the one the GPU machine
runs (`main`, as `python -m bench.window train` calls it), on a tiny student, a tiny teacher with an
MLM head and a tiny corpus made here."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from bench import window

pytestmark = pytest.mark.slow  # two compiled steps with a teacher inside, and the paper shape's: ~40 s

TINY_STUDENT = ("model.hidden_size=32", "model.num_hidden_layers=2", "model.max_position_embeddings=64",
                "data.seq_len=64", "eval_batches=1")  # fmt: skip
TINY_PAPER = ("model.hidden_size=32", "model.num_hidden_layers=1", "model.intermediate_size=64",
              "model.max_position_embeddings=64", "data.seq_len=64", "log_every=1")  # fmt: skip


def tiny_teacher(path):
    """A BERT masked LM with the project's vocabulary, d = 32, 2 layers, as transformers writes it."""
    import shutil

    from transformers import BertConfig, BertForMaskedLM

    from model.tokenizer import BERT_UNCASED_VOCAB

    config = BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                        max_position_embeddings=128)  # fmt: skip
    BertForMaskedLM(config).save_pretrained(str(path))
    shutil.copyfile(BERT_UNCASED_VOCAB, path / "vocab.txt")
    return path


@pytest.fixture(scope="module")
def shipped(tmp_path_factory):
    from model.tokenizer import bert_uncased_tokenizer
    from training.data import build_corpus

    base = tmp_path_factory.mktemp("window")
    build_corpus(["kjv"], base / "corpus", seq_len=64, max_docs=40, tokenizer=bert_uncased_tokenizer())
    teacher = tiny_teacher(base / "teacher")
    whole = window.pack(base / "corpus", teacher, base / "whole", room_bytes=64 * 2**20, seq_len=64)
    # room for the teacher and a third of the train rows' bytes: the train split travels as a sample
    teacher_bytes = sum(r["bytes"] for name, r in whole["files"].items() if name.startswith("teacher/"))
    corpus = whole["corpus"]["splits"]
    held_out = corpus["validation"]["compressed_bytes"] + corpus["test"]["compressed_bytes"]
    room = teacher_bytes + held_out + corpus["train"]["compressed_bytes"] // 3 + 64 * 1024
    manifest = window.pack(base / "corpus", teacher, base / "bundle", room_bytes=room, seq_len=64)
    out, work = base / "out", base / "work"
    argv = [
        "train",
        "--bundle",
        str(base / "bundle"),
        "--out",
        str(out),
        "--work",
        str(work),
        "--steps",
        "4",
        "--batch-size",
        "8",
        "--budget-s",  # the run's time guard out of the way on a loaded machine: it stops at --steps
        "900",
        "--paper-batch",
        "2",
        "--paper-least-s",
        "5",
        "--paper-s",
        "4",
    ]
    argv += [f"--set={o}" for o in TINY_STUDENT] + [f"--paper-set={o}" for o in TINY_PAPER]
    with pytest.raises(SystemExit) as ended:
        window.main(argv)
    assert ended.value.code == 0
    return base, manifest, out, work


def test_the_shipped_shards_load_back_as_the_trained_parameters_in_fp16_bit_for_bit(shipped, tmp_path):
    import orbax.checkpoint as ocp

    from training.artifact import load_artifact
    from training.distill import student_params

    base, _, out, work = shipped
    shards = sorted(out.glob("model-*.safetensors"))
    assert shards and all(s.stat().st_size <= window.SHARD_LIMIT for s in shards)
    assert len([p for p in out.iterdir() if p.is_file()]) <= 8
    artifact = window.unpack(out, tmp_path / "back")
    _, loaded = load_artifact(artifact)
    manager = ocp.CheckpointManager((work / "student" / "checkpoints").absolute())
    trained = manager.restore(4)["params"]
    trained = student_params(trained)

    def leaves(tree, prefix=()):
        for key, value in tree.items():
            if isinstance(value, dict):
                yield from leaves(value, (*prefix, key))
            else:
                yield (*prefix, key), np.asarray(value)

    trained_leaves = dict(leaves(trained))
    loaded_leaves = dict(leaves(loaded))
    assert set(loaded_leaves) <= set(trained_leaves)
    assert len(loaded_leaves) >= len(trained_leaves) - 1  # the tied decoder is the word embedding
    for key, value in loaded_leaves.items():
        expected = trained_leaves[key].astype(np.float16)
        assert np.array_equal(value.astype(np.float16), expected), key
        assert np.array_equal(value, expected.astype(value.dtype)), key  # nothing but the fp16 rounding


def test_the_card_names_every_field_and_what_travelled_and_came_back(shipped):
    base, manifest, out, _ = shipped
    card = json.loads((out / window.CARD).read_text())
    assert set(card) == set(window.WindowCard.model_fields)
    assert card["failed"] is None and card["steps"] == 4 and card["batch_size"] == 8
    assert card["tokens"] > 0 and card["tokens_per_s"] > 0 and card["device"]["backend"] == "cpu"
    assert "mfu" in card  # None on a CPU: no datasheet peak
    assert card["losses"]["first"]["loss"] > 0 and card["losses"]["last"]["step"] == 4
    assert card["losses"]["held_out"]["eval_accuracy"] >= 0
    assert card["travelled"]["files"] == manifest["files"]
    for name, record in card["shipped"].items():
        assert window.file_record(out / name) == record
    assert card["teacher_adaptation"] is None  # the tiny teacher has its MLM head
    assert card["student_card"]["distill"]["settings"]["logits_weight"] == 1.0
    paper = card["paper_shape"]
    assert paper["steps"] > 0 and paper["tokens_per_s"] > 0 and paper["length"] == 64 and paper["batch"] == 2


def test_the_bundle_carries_the_held_out_rows_whole_and_a_seeded_sample_of_the_train_rows(shipped, tmp_path):
    from training.data.corpus import open_split

    base, manifest, _, _ = shipped
    data = window.unpack_corpus(base / "bundle" / "corpus", tmp_path / "data")
    splits = manifest["corpus"]["splits"]
    for split in ("validation", "test"):
        assert np.array_equal(open_split(data, split, 64)[:], open_split(base / "corpus", split, 64)[:])
    train, original = open_split(data, "train", 64)[:], open_split(base / "corpus", "train", 64)[:]
    assert splits["train"]["rows_carried"] == len(train) < splits["train"]["rows_built"] == len(original)
    assert {r.tobytes() for r in train} <= {r.tobytes() for r in original}


def test_the_teacher_widened_from_8_bits_is_within_half_a_step_of_each_row(shipped, tmp_path):
    from safetensors.numpy import load_file

    base, _, _, _ = shipped
    widened = load_file(str(window.widen_teacher(base / "bundle" / "teacher", tmp_path / "t") / "model.safetensors"))
    original = load_file(str(base / "teacher" / "model.safetensors"))
    assert set(widened) == set(original)
    for key, value in original.items():
        if value.ndim == 2:
            step = np.abs(value).max(axis=1, keepdims=True) / 127
            assert np.all(np.abs(widened[key] - value) <= step / 2 + 1e-7), key
        else:
            assert np.array_equal(widened[key], value.astype(np.float16).astype(np.float32)), key


def test_a_teacher_without_an_mlm_head_is_adapted_there_first_and_a_probe_sizes_the_run(shipped, tmp_path):
    """The path the call takes where no adapted teacher was carried (the PyPI sentence encoder travels):
    the teacher-mlm stage makes it a masked LM for --adapt-s, then a probe of the student's step sizes the
    run to what the budget leaves (here nothing: one step), and the paper shape is skipped with its reason."""
    import shutil

    from transformers import BertConfig, BertModel

    from model.tokenizer import BERT_UNCASED_VOCAB
    from training.teacher import Teacher

    base, _, _, _ = shipped
    encoder = tmp_path / "encoder"
    config = BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                        max_position_embeddings=128)  # fmt: skip
    BertModel(config).save_pretrained(str(encoder))
    shutil.copyfile(BERT_UNCASED_VOCAB, encoder / "vocab.txt")
    window.pack(base / "corpus", encoder, tmp_path / "bundle", room_bytes=64 * 2**20, seq_len=64)
    out = tmp_path / "out"
    argv = ["train", "--bundle", str(tmp_path / "bundle"), "--out", str(out), "--work", str(tmp_path / "work"),
            "--batch-size", "8", "--budget-s", "60", "--adapt-s", "3", "--paper-least-s", "1000",
            *[f"--set={o}" for o in TINY_STUDENT]]  # fmt: skip
    with pytest.raises(SystemExit) as ended:
        window.main(argv)
    assert ended.value.code == 0
    card = json.loads((out / window.CARD).read_text())
    adapted = Path(card["teacher_adaptation"]["weights"])
    assert Teacher.from_dir(adapted).has_mlm_head
    assert card["student_card"]["distill"]["logits_teacher"]["path"] == str(adapted)
    assert card["probe"]["steps"] == 30 and card["probe"]["tokens_per_s"] > 0
    assert card["steps"] >= 1 and card["shipped"] and card["failed"] is None
    assert "under 1000 s" in card["paper_shape"]["skipped"]
