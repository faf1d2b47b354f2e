"""Distillation losses from a teacher (training/teacher.py) into BiGS, as pure JAX functions
(docs/DESIGN.md §1.5).

The teacher reads the UNMASKED text while the student reads the masked one (data2vec / BEiT v2
style): at a masked position the target is the teacher's state for the token that was hidden, so
the student learns to predict contextual representations as well as the token (the MLM loss).
Both losses below count every real token (attention mask 1), masked positions included, and no
padding.

(a) `hidden_state_loss`: chosen student layers ↔ teacher layers (`layer_pairs`, uniform by default:
    student layer i ↔ teacher layer round(i · N_t / N_s), embeddings ↔ embeddings excluded), each
    student state through its own learned linear projection d_s → d_t (`init_projection`), then the
    mean squared error per element over real tokens ("mse"), or 1 − cosine per token ("cosine"),
    averaged over the pairs.
(b) `sentence_embedding_loss`: the student's last hidden states mean-pooled over real tokens, through
    a learned projection to the teacher's width, L2-normalised, against the teacher's sentence
    embedding (normalised too): 1 − cosine, averaged over the batch.

(c) `logit_distillation_loss`: a masked LM teacher's answers (e.g. `bigs train teacher-mlm`'s artifact):
    at every masked position, T² · KL(softmax(z_t / T) ‖ softmax(z_s / T)) between the teacher's and the
    student's distributions over the vocabulary (Hinton et al.'s soft targets; T² keeps the gradient's
    scale independent of T), averaged over the masked positions. Here the teacher reads the MASKED
    text, as the student does: its answers to the same question are what is distilled.

1 − cos(a, b) is computed as ½‖â − b̂‖² (equal for unit vectors), so it is exactly 0 when the two
normalised vectors are equal and never negative by rounding.

Projections are `{"kernel": (d_s, d_t), "bias": (d_t,)}` pytrees: they train with the student (put
them in the optimiser's tree) and are dropped when the student is exported.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp


def layer_pairs(num_student_layers: int, num_teacher_layers: int) -> list[tuple[int, int]]:
    """Uniform map (TinyBERT's): student layer i (1..N_s) ↔ teacher layer round(i·N_t/N_s); indices are
    into hidden-state tuples whose entry 0 is the embeddings' output, so the last maps to the last."""
    if num_student_layers < 1 or num_teacher_layers < 1:
        raise ValueError("both models need at least one layer")
    return [(i, round(i * num_teacher_layers / num_student_layers)) for i in range(1, num_student_layers + 1)]


def init_projection(key, student_width: int, teacher_width: int, kernel=None) -> dict:
    """A learned d_s → d_t linear map: `kernel` if given (e.g. the transpose of init_from_teacher's PCA
    axes, which inverts the embedding projection), else normal with σ = 1/√d_s; bias 0."""
    if kernel is None:
        kernel = jax.random.normal(key, (student_width, teacher_width)) / jnp.sqrt(student_width)
    kernel = jnp.asarray(kernel, dtype=jnp.float32)
    if kernel.shape != (student_width, teacher_width):
        raise ValueError(f"projection kernel {kernel.shape} != ({student_width}, {teacher_width})")
    return {"kernel": kernel, "bias": jnp.zeros((teacher_width,), jnp.float32)}


def project(projection: dict, x):
    return x @ projection["kernel"] + projection["bias"]


def _normalize(x, eps: float = 1e-12):
    return x / jnp.maximum(jnp.linalg.norm(x, axis=-1, keepdims=True), eps)


def one_minus_cosine(a, b):
    """1 − cos(a, b) over the last axis, as ½‖â − b̂‖²: exactly 0 when â = b̂, in [0, 2]."""
    return 0.5 * jnp.sum(jnp.square(_normalize(a) - _normalize(b)), axis=-1)


def hidden_state_loss(
    student_hidden: Sequence,
    teacher_hidden: Sequence,
    projections: Sequence[dict],
    real_tokens,
    pairs: Sequence[tuple[int, int]],
    kind: str = "mse",
):
    """Mean over `pairs` (student index, teacher index) of the per-token distance between
    project(student_hidden[s]) (B, L, d_t) and teacher_hidden[t] (B, L, d_t), averaged over the real
    tokens (`real_tokens` (B, L), the attention mask: masked positions count, padding does not).
    `projections[k]` belongs to pairs[k]. kind "mse": mean over the d_t elements of the squared
    difference; "cosine": 1 − cosine per token."""
    if len(projections) != len(pairs):
        raise ValueError(f"{len(pairs)} layer pairs but {len(projections)} projections")
    if kind not in ("mse", "cosine"):
        raise ValueError(f"kind must be 'mse' or 'cosine', got {kind!r}")
    weights = real_tokens.astype(jnp.float32)
    count = jnp.maximum(weights.sum(), 1.0)
    total = 0.0
    for projection, (s, t) in zip(projections, pairs, strict=True):
        predicted = project(projection, student_hidden[s].astype(jnp.float32))
        target = jax.lax.stop_gradient(teacher_hidden[t].astype(jnp.float32))
        if kind == "mse":
            per_token = jnp.mean(jnp.square(predicted - target), axis=-1)
        else:
            per_token = one_minus_cosine(predicted, target)
        total = total + jnp.sum(per_token * weights) / count
    return total / len(pairs)


def pooled_student_embedding(student_last_hidden, real_tokens, projection: dict):
    """Mean over real tokens (B, L, d_s) → (B, d_s), projected to d_t and L2-normalised."""
    weights = real_tokens.astype(jnp.float32)[..., None]
    pooled = (student_last_hidden.astype(jnp.float32) * weights).sum(axis=1) / jnp.maximum(weights.sum(axis=1), 1e-9)
    return _normalize(project(projection, pooled))


def sentence_embedding_loss(student_last_hidden, real_tokens, projection: dict, teacher_embedding):
    """1 − cos(student's pooled, projected, normalised embedding, teacher's sentence embedding), mean over
    the batch. `teacher_embedding` (B, d_t): `TeacherOutput.sentence_embedding` of the same texts."""
    student = pooled_student_embedding(student_last_hidden, real_tokens, projection)
    return jnp.mean(one_minus_cosine(student, jax.lax.stop_gradient(teacher_embedding.astype(jnp.float32))))


def logit_distillation_sum(student_logits, teacher_logits, labels, temperature: float, where_teacher_right=False):
    """Σ over the masked positions (labels != −100) of T² · KL(softmax(t/T) ‖ softmax(s/T)), logits
    (B, P, V) at the same positions. KL is computed from log-softmaxes (no 0 · log 0), and is ≥ 0 up to
    rounding; exactly 0 where the two distributions are equal.

    `where_teacher_right` counts only the masked positions whose original token is the teacher's first
    answer: a teacher weaker than the student on part of the corpus then teaches its distribution (the
    near-synonyms beside the word) where it knows the word, and the MLM loss alone teaches the rest."""
    counted = (labels != -100).astype(jnp.float32)
    if where_teacher_right:
        counted = counted * (jnp.argmax(teacher_logits, axis=-1) == labels).astype(jnp.float32)
    log_p_teacher = jax.nn.log_softmax(jax.lax.stop_gradient(teacher_logits).astype(jnp.float32) / temperature)
    log_p_student = jax.nn.log_softmax(student_logits.astype(jnp.float32) / temperature)
    kl = jnp.sum(jnp.exp(log_p_teacher) * (log_p_teacher - log_p_student), axis=-1)  # (B, P)
    return temperature**2 * jnp.sum(kl * counted)


# ------------------------------------------------------------------------------------------
# The distilled MLM objective: what a stage hands the trainer (apply_fn, loss_sums, params)
# ------------------------------------------------------------------------------------------

# The top-level params key under which the projections train beside the student's own tree; the
# stage strips it before anything is written as an artifact (the served model never has it).
PROJECTIONS_KEY = "distill_projections"


def student_params(params: dict) -> dict:
    """The student's own tree: everything but the distillation projections."""
    return {k: v for k, v in params.items() if k != PROJECTIONS_KEY}


class _TeacherObjective:
    """What both objectives share: the frozen teacher, its params as JAX arrays, the layer pairs, and
    the projections (one per layer pair, one for the sentence embedding) that train beside the student
    under `PROJECTIONS_KEY`."""

    def __init__(self, module, teacher, settings, matmul_dtype=None, logits_teacher=None):
        self.module = module
        self.teacher = teacher
        self.settings = settings
        self.matmul_dtype = matmul_dtype
        # a masked LM whose answers are distilled (settings.logits_weight > 0), frozen like the teacher
        self.logits_teacher = logits_teacher
        self.logits_teacher_params = (
            None if logits_teacher is None else jax.tree_util.tree_map(jnp.asarray, logits_teacher.mlm_flax_params)
        )
        n_student = module.config.num_hidden_layers
        self.pairs = (
            [tuple(p) for p in settings.layer_pairs]
            if settings.layer_pairs
            else layer_pairs(n_student, teacher.num_layers)
        )
        for s, t in self.pairs:
            if not (1 <= s <= n_student and 1 <= t <= teacher.num_layers):
                raise ValueError(
                    f"layer pair ({s}, {t}) outside the student's 1..{n_student} or the teacher's "
                    f"1..{teacher.num_layers} layers"
                )
        self.teacher_params = jax.tree_util.tree_map(jnp.asarray, teacher.flax_params)

    def init_projections(self, seed: int, kernel=None) -> dict:
        """Fresh projections: `kernel` (d_s, d_t) for every one if given (e.g. the PCA axes transposed,
        the inverse of the embedding map), else random."""
        d_s, d_t = self.module.config.hidden_size, self.teacher.hidden_size
        keys = jax.random.split(jax.random.PRNGKey(seed), len(self.pairs) + 1)
        return {
            "layers": {str(i): init_projection(keys[i], d_s, d_t, kernel) for i in range(len(self.pairs))},
            "sentence": init_projection(keys[-1], d_s, d_t, kernel),
        }

    def teacher_losses(self, params, student_hidden, teacher_input_ids, attention_mask, token_type_ids) -> dict:
        """{loss name: mean} of the losses whose weight is > 0: the teacher reads `teacher_input_ids`."""
        teacher = self.teacher.apply_jax(
            self.teacher_params, teacher_input_ids, attention_mask, token_type_ids, matmul_dtype=self.matmul_dtype
        )
        projections = params[PROJECTIONS_KEY]
        losses = {}
        if self.settings.hidden_weight > 0:
            layer_projections = [projections["layers"][str(i)] for i in range(len(self.pairs))]
            losses["hidden_loss"] = hidden_state_loss(
                student_hidden, teacher.hidden_states, layer_projections, attention_mask, self.pairs,
                kind=self.settings.hidden_kind,
            )  # fmt: skip
        if self.settings.embedding_weight > 0:
            losses["embedding_loss"] = sentence_embedding_loss(
                student_hidden[-1], attention_mask, projections["sentence"], teacher.sentence_embedding
            )
        return losses

    def weighted(self, losses: dict, n):
        """(Σ weight × mean × n, {name: mean × n}): the losses as sums over `n` counted items."""
        weights = {"hidden_loss": self.settings.hidden_weight, "embedding_loss": self.settings.embedding_weight}
        total, parts = 0.0, {}
        for name, mean in losses.items():
            total = total + weights[name] * mean * n
            parts[name] = mean * n
        return total, parts


class DistilledMLM(_TeacherObjective):
    """The MLM loss with a teacher's losses beside it, as a (apply_fn, loss_sums) pair for the trainer.

    `apply_fn` runs the student on the masked text (with its hidden states), the frozen teacher on
    `unmasked_input_ids` and, where a logit loss is weighted, the frozen teacher MLM on the masked text
    at the same positions, all inside the same jit, and returns (logits, {loss name: mean}, the teacher
    MLM's logits or None); `loss_sums` adds the weighted means to the MLM sum as mean × count, so the
    trainer's division by the count of masked tokens gives MLM mean + Σ weight × distillation mean, and
    reports each part beside it (`mlm_loss`, `hidden_loss`, `embedding_loss`, `logits_loss`). The
    params are the student's tree plus `PROJECTIONS_KEY`: one projection per layer pair, and one for
    the sentence embedding.
    """

    def apply_fn(self, variables, input_ids, attention_mask=None, token_type_ids=None, logits_positions=None,
                 unmasked_input_ids=None, deterministic=True, rngs=None):  # fmt: skip
        params = variables["params"]
        logits, student_hidden = self.module.apply(
            {"params": student_params(params)}, input_ids, attention_mask, token_type_ids,
            deterministic=deterministic, logits_positions=logits_positions, output_hidden_states=True, rngs=rngs,
        )  # fmt: skip
        teacher_logits = None
        if self.settings.logits_weight > 0:
            teacher_logits = self.logits_teacher.apply_jax_mlm(
                self.logits_teacher_params, input_ids, attention_mask, token_type_ids, logits_positions,
                matmul_dtype=self.matmul_dtype,
            )  # fmt: skip
        if self.settings.hidden_weight == 0 and self.settings.embedding_weight == 0:
            return logits, {}, teacher_logits  # no pass of the teacher encoder to pay (init_from_teacher only)
        if unmasked_input_ids is None:
            raise ValueError("a distilled MLM batch carries unmasked_input_ids (the text the teacher reads)")
        losses = self.teacher_losses(params, student_hidden, unmasked_input_ids, attention_mask, token_type_ids)
        return logits, losses, teacher_logits

    def loss_sums(self, outputs, labels):
        from .steps import mlm_loss_sums

        logits, losses, teacher_logits = outputs
        mlm_sum, count, extra = mlm_loss_sums(logits, labels)
        distilled, parts = self.weighted(losses, count.astype(jnp.float32))
        if teacher_logits is not None:
            logits_sum = logit_distillation_sum(
                logits, teacher_logits, labels, self.settings.temperature,
                where_teacher_right=self.settings.logits_where == "teacher_right",
            )  # fmt: skip
            distilled = distilled + self.settings.logits_weight * logits_sum
            parts["logits_loss"] = logits_sum
        return mlm_sum + distilled, count, {**extra, "mlm_loss": mlm_sum, **parts}


class DistilledEmbedding(_TeacherObjective):
    """A dedicated embedding model: the teacher's losses alone, no MLM. Student and teacher read the
    same, unmasked text (what an embedding model is asked to embed); the sentence-embedding loss is the
    objective, the hidden-state loss (where weighted) keeps the layers near the teacher's.

    `module` is the bare encoder (`FlaxBiGSEncoderModelModule`: (last hidden, hidden states)).
    `apply_fn` returns (the student's projected, normalised embeddings (B, d_t), {loss name: mean});
    `loss_sums` counts rows: labels (B,) are 1 for a row that counts, −100 for a filler row, so the
    trainer's division gives Σ weight × mean per row and reports each loss beside it.
    """

    def apply_fn(self, variables, input_ids, attention_mask=None, token_type_ids=None, deterministic=True,
                 rngs=None):  # fmt: skip
        params = variables["params"]
        if attention_mask is None:
            attention_mask = jnp.ones_like(input_ids)
        if token_type_ids is None:
            token_type_ids = jnp.zeros_like(input_ids)
        _, student_hidden = self.module.apply(
            {"params": student_params(params)}, input_ids, attention_mask, token_type_ids,
            deterministic=deterministic, output_hidden_states=True, rngs=rngs,
        )  # fmt: skip
        losses = self.teacher_losses(params, student_hidden, input_ids, attention_mask, token_type_ids)
        embedding = pooled_student_embedding(student_hidden[-1], attention_mask, params[PROJECTIONS_KEY]["sentence"])
        return embedding, losses

    def loss_sums(self, outputs, labels):
        _, losses = outputs
        count = jnp.sum(labels != -100)
        total, parts = self.weighted(losses, count.astype(jnp.float32))
        return total, count, parts
