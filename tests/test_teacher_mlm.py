"""The teacher adapted into a masked LM (`bigs train teacher-mlm`) and the distillation of its answers
(training/distill.py's logit loss, one more loss of DistilledMLM).

The stage runs for real on the default teacher (all-MiniLM-L6-v2) and real text (KJV chapters): its
artifact is a BertForMaskedLM dir that plain transformers loads and that answers the same as `bigs eval`
reads it; a run going on from it keeps its head; a student distils its answers and the logit loss falls.
The loss itself: zero for identical distributions, falling along any path to the teacher's, counting
masked positions only."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file

from training.config import DistillSettings, load_config
from training.distill import logit_distillation_sum
from training.stages import run
from training.teacher import Teacher, default_teacher_dir
from training.trainer import read_metrics

V = 50


def random_logits(seed: int, shape=(3, 4, V)):
    return jax.random.normal(jax.random.PRNGKey(seed), shape) * 3.0


LABELS = jnp.asarray([[1, 2, 3, -100], [4, -100, -100, -100], [5, 6, 7, 8]])


# ---- the loss -----------------------------------------------------------------------------


@pytest.mark.parametrize("temperature", [1.0, 2.0])
def test_the_logit_loss_is_zero_for_identical_distributions(temperature):
    teacher = random_logits(0)
    assert float(logit_distillation_sum(teacher, teacher, LABELS, temperature)) == pytest.approx(0.0, abs=1e-5)
    # a constant shift of the logits is the same distribution
    assert float(logit_distillation_sum(teacher + 7.0, teacher, LABELS, temperature)) == pytest.approx(0.0, abs=1e-4)


def test_the_logit_loss_falls_as_the_student_meets_the_teacher():
    """KL is convex in the student's logits with its minimum at the teacher's, so along the segment from
    any student to the teacher it never rises, and it is positive away from it."""
    teacher, student = random_logits(0), random_logits(1)
    losses = [
        float(logit_distillation_sum((1 - a) * student + a * teacher, teacher, LABELS, 2.0))
        for a in np.linspace(0, 1, 6)
    ]
    assert losses[0] > 1.0 and losses[-1] == pytest.approx(0.0, abs=1e-4)
    assert all(later <= earlier + 1e-5 for earlier, later in zip(losses, losses[1:], strict=False)), losses


def test_the_logit_loss_counts_masked_positions_only_and_scales_by_t_squared():
    teacher, student = random_logits(0), random_logits(1)
    # what sits at an unlabelled position (−100) changes nothing
    noisy = student.at[1, 1:].set(random_logits(2)[1, 1:])
    assert float(logit_distillation_sum(noisy, teacher, LABELS, 2.0)) == pytest.approx(
        float(logit_distillation_sum(student, teacher, LABELS, 2.0)), rel=1e-6
    )
    # T² · KL of the softened distributions, position by position (an independent formula in numpy)
    t, s, temp = np.asarray(teacher, np.float64), np.asarray(student, np.float64), 3.0
    p = np.exp(t / temp) / np.exp(t / temp).sum(-1, keepdims=True)
    q = np.exp(s / temp) / np.exp(s / temp).sum(-1, keepdims=True)
    expected = temp**2 * ((p * np.log(p / q)).sum(-1) * (np.asarray(LABELS) != -100)).sum()
    assert float(logit_distillation_sum(student, teacher, LABELS, temp)) == pytest.approx(expected, rel=1e-4)


def test_where_the_teacher_is_right_the_logit_loss_counts_only_positions_whose_token_is_its_first_answer():
    teacher, student = random_logits(0), random_logits(1)
    top1 = np.asarray(jnp.argmax(teacher, axis=-1))
    # labels: the teacher's first answer at three masked positions, another token at the others
    labels = np.where(np.asarray(LABELS) == -100, -100, (top1 + 1) % V)
    right = [(0, 1), (2, 0), (2, 3)]
    for b, p in right:
        labels[b, p] = top1[b, p]
    labels = jnp.asarray(labels)
    only_right = float(logit_distillation_sum(student, teacher, labels, 2.0, where_teacher_right=True))
    # the same sum as the plain loss over a label set that keeps just those three positions
    kept = np.full_like(np.asarray(LABELS), -100)
    for b, p in right:
        kept[b, p] = int(labels[b, p])
    assert only_right == pytest.approx(
        float(logit_distillation_sum(student, teacher, jnp.asarray(kept), 2.0)), rel=1e-6
    )
    assert 0 < only_right < float(logit_distillation_sum(student, teacher, labels, 2.0))
    # a teacher wrong everywhere teaches nothing
    wrong = jnp.asarray(np.where(np.asarray(LABELS) == -100, -100, (top1 + 1) % V))
    assert float(logit_distillation_sum(student, teacher, wrong, 2.0, where_teacher_right=True)) == 0.0


def test_a_logit_weight_needs_a_logits_teacher():
    with pytest.raises(ValueError, match="needs logits_teacher"):
        DistillSettings(logits_weight=1.0)


def test_the_embed_stage_takes_no_logit_loss():
    with pytest.raises(ValueError, match="stage embed has no MLM head"):
        load_config(overrides=["stage=embed", "init_from=x", 'distill={"embedding_weight": 1.0, '
                               '"logits_weight": 1.0, "logits_teacher": "y"}'])  # fmt: skip


# ---- the stage ------------------------------------------------------------------------------


def teacher_overrides(out, data_dir, steps, *more):
    return [
        "stage=teacher-mlm",
        "init_from=default",
        f"output_dir={out}",
        f"data.data_dir={data_dir}",
        'data.sources=["kjv"]',
        "data.max_docs=200",
        "data.seq_len=64",
        "batch_size=8",
        f"num_steps={steps}",
        "eval_every=4",
        "eval_batches=2",
        "log_every=2",
        "checkpoint_every=4",
        "optim.warmup_steps=1",
        "optim.learning_rate=3e-4",
        "model.hidden_dropout_prob=0.0",
        "progress=false",
        *more,
    ]


@pytest.fixture(scope="module")
def adapted(tmp_path_factory):
    base = tmp_path_factory.mktemp("teacher-mlm")
    artifact = run(load_config(overrides=teacher_overrides(base / "run", base / "data", 8)))
    return artifact, read_metrics(base / "run" / "metrics.jsonl"), base


@pytest.mark.slow
def test_the_adapted_teacher_learns_the_masked_tokens_in_a_short_run(adapted):
    artifact, metrics, _ = adapted
    evals = [m for m in metrics if "eval_loss" in m]
    assert evals[0]["step"] == 0 and evals[-1]["step"] == 8
    assert evals[-1]["eval_loss"] < evals[0]["eval_loss"] - 1.0  # a fresh head starts at ~ln(30,522) = 10.3
    card = json.loads((artifact / "training_card.json").read_text())
    assert card["stage"] == "teacher-mlm"
    assert card["adapted_from"] == {
        "teacher": str(default_teacher_dir()),
        "mlm_head": "fresh (BERT init, decoder tied)",
    }


@pytest.mark.slow
def test_the_adapted_teacher_loads_in_plain_transformers_and_answers_as_bigs_eval_reads_it(adapted):
    import torch
    from transformers import BertForMaskedLM, BertTokenizerFast

    from training.evaluation import open_model, read_cloze, score_cloze

    artifact, _, _ = adapted
    config = json.loads((artifact / "config.json").read_text())
    assert config["model_type"] == "bert" and config["architectures"] == ["BertForMaskedLM"]
    model, info = BertForMaskedLM.from_pretrained(str(artifact), output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    tokenizer = BertTokenizerFast.from_pretrained(str(artifact))
    encoded = tokenizer(["the lord is my [MASK] ; i shall not want .", "in the [MASK] was the word"],
                        padding=True, return_tensors="np")  # fmt: skip
    ids, mask = encoded["input_ids"], encoded["attention_mask"]
    positions = np.argwhere(ids == tokenizer.mask_token_id)[:, 1][:, None]
    with torch.no_grad():
        expected = model.eval()(torch.from_numpy(ids), attention_mask=torch.from_numpy(mask)).logits.numpy()
    expected = np.take_along_axis(expected, positions[..., None], axis=1)
    evaluated = open_model(artifact)
    np.testing.assert_allclose(evaluated.fill_mask(ids, mask, positions), expected, atol=1e-4)
    rows, _ = score_cloze(evaluated, tokenizer, read_cloze()[:8])
    assert {r.metric for r in rows} >= {"top-1", "top-5"} and all(r.count == 8 for r in rows)


@pytest.mark.slow
def test_a_run_going_on_from_the_adapted_teacher_keeps_its_head_and_weights(adapted, tmp_path):
    """The BERT dir reads back as the row it was written from: one step at a learning rate of ~0 from it
    writes the same weights (fp16 storage both times), MLM head included."""
    artifact, _, base = adapted
    more = (f"init_from={artifact}", "optim.learning_rate=1e-12", "eval_every=1", "checkpoint_every=1")
    again = run(load_config(overrides=teacher_overrides(tmp_path / "run", base / "data", 1, *more)))
    card = json.loads((again / "training_card.json").read_text())
    assert card["adapted_from"]["mlm_head"] == "the teacher's"
    before, after = load_file(artifact / "model.safetensors"), load_file(again / "model.safetensors")
    assert before.keys() == after.keys() and "cls.predictions.transform.dense.weight" in after
    for key in before:
        np.testing.assert_allclose(after[key].astype(np.float32), before[key].astype(np.float32), atol=1e-3)


@pytest.mark.slow
def test_a_teacher_with_another_vocabulary_is_refused_by_name(tmp_path, other_vocab_teacher):
    teacher_dir, _ = other_vocab_teacher
    config = load_config(
        overrides=teacher_overrides(tmp_path / "run", tmp_path / "data", 1, f"init_from={teacher_dir}")
    )
    with pytest.raises(ValueError, match="vocabulary"):
        run(config)


# ---- distilling its answers -------------------------------------------------------------------


def student_overrides(out, data_dir, steps, distill: dict):
    return [
        f"output_dir={out}",
        f"data.data_dir={data_dir}",
        'data.sources=["kjv"]',
        "data.max_docs=200",
        "data.seq_len=64",
        "batch_size=8",
        f"num_steps={steps}",
        "eval_every=10",
        "eval_batches=2",
        "log_every=5",
        "checkpoint_every=10",
        "optim.warmup_steps=2",
        "optim.learning_rate=2e-3",
        "model.hidden_size=64",
        "model.num_hidden_layers=2",
        "model.max_position_embeddings=64",
        "model.hidden_dropout_prob=0.0",
        "progress=false",
        f"distill={json.dumps(distill)}",
    ]


@pytest.mark.slow
def test_a_student_distils_the_adapted_teachers_answers_and_the_logit_loss_falls(adapted, tmp_path):
    artifact, _, base = adapted
    distill = {"hidden_weight": 0.0, "logits_teacher": str(artifact), "logits_weight": 1.0, "temperature": 2.0}
    student = run(load_config(overrides=student_overrides(tmp_path / "run", base / "data", 20, distill)))
    evals = [m for m in read_metrics(tmp_path / "run" / "metrics.jsonl") if "eval_loss" in m]
    first, last = evals[0], evals[-1]
    assert last["eval_logits_loss"] < first["eval_logits_loss"], (first, last)
    assert last["eval_loss"] == pytest.approx(last["eval_mlm_loss"] + last["eval_logits_loss"], rel=1e-5)
    card = json.loads((student / "training_card.json").read_text())
    assert card["distill"]["logits_teacher"]["path"] == str(artifact)
    assert card["distill"]["logits_teacher"]["card"]["stage"] == "teacher-mlm"


@pytest.mark.slow
def test_a_logits_teacher_without_an_mlm_head_is_refused(tmp_path):
    distill = {"logits_teacher": str(default_teacher_dir()), "logits_weight": 1.0}
    config = load_config(overrides=student_overrides(tmp_path / "run", tmp_path / "data", 1, distill))
    with pytest.raises(ValueError, match="has no MLM head"):
        run(config)
    assert not Teacher.from_dir(default_teacher_dir()).has_mlm_head
