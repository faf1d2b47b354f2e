"""Distillation losses (training/distill.py): exactly zero when the student equals the teacher
(identity projections, same states), positive otherwise, counting masked positions but not padding,
and falling while optax fits the projections on fixed random states."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from training.distill import (
    hidden_state_loss,
    init_projection,
    layer_pairs,
    sentence_embedding_loss,
)
from training.teacher import PoolingSpec, pool_sentence

B, L, D_T, D_S = 3, 10, 24, 16


def states(key, layers: int, width: int):
    keys = jax.random.split(key, layers + 1)
    return tuple(jax.random.normal(k, (B, L, width)) for k in keys)


def mask():
    m = np.ones((B, L), np.int32)
    m[1, 7:] = 0  # padding
    m[2, 4:] = 0
    return jnp.asarray(m)


def identity(width: int):
    return init_projection(None, width, width, kernel=jnp.eye(width))


def test_layer_pairs_are_uniform_and_end_at_the_last_layers():
    assert layer_pairs(4, 6) == [(1, 2), (2, 3), (3, 4), (4, 6)]
    assert layer_pairs(6, 6) == [(i, i) for i in range(1, 7)]
    assert layer_pairs(12, 6)[-1] == (12, 6)


@pytest.mark.parametrize("kind", ["mse", "cosine"])
def test_hidden_state_loss_is_zero_for_the_teacher_itself_and_positive_otherwise(kind):
    teacher = states(jax.random.PRNGKey(0), 6, D_T)
    pairs = layer_pairs(6, 6)
    ones = [identity(D_T)] * len(pairs)
    assert float(hidden_state_loss(teacher, teacher, ones, mask(), pairs, kind)) == 0.0
    other = states(jax.random.PRNGKey(1), 6, D_T)
    assert float(hidden_state_loss(other, teacher, ones, mask(), pairs, kind)) > 0.1


@pytest.mark.parametrize("kind", ["mse", "cosine"])
def test_masked_positions_count_and_padding_does_not(kind):
    """The student reads the masked text, the teacher the unmasked: a difference at a masked (real)
    position is a loss; one at a padding position is not."""
    teacher = states(jax.random.PRNGKey(0), 2, D_T)
    pairs, ones = [(1, 1), (2, 2)], [identity(D_T)] * 2
    at_masked = tuple(h.at[0, 3].add(1.0) for h in teacher)  # position 3 of row 0: real (say, [MASK] there)
    at_padding = tuple(h.at[2, 8].add(1.0) for h in teacher)  # row 2 is padding from position 4
    assert float(hidden_state_loss(at_masked, teacher, ones, mask(), pairs, kind)) > 0.0
    assert float(hidden_state_loss(at_padding, teacher, ones, mask(), pairs, kind)) == 0.0


def test_sentence_embedding_loss_is_zero_for_the_teacher_itself_and_positive_otherwise():
    hidden = states(jax.random.PRNGKey(2), 0, D_T)[0]
    spec = PoolingSpec(modes=("mean_tokens",), normalize=True)  # all-MiniLM-L6-v2's: mean, then Normalize
    teacher_embedding = pool_sentence(hidden, mask(), spec)
    assert float(sentence_embedding_loss(hidden, mask(), identity(D_T), teacher_embedding)) == 0.0
    # padding does not enter the pool: changing a padded state changes nothing
    assert float(sentence_embedding_loss(hidden.at[1, 9].add(5.0), mask(), identity(D_T), teacher_embedding)) == 0.0
    other = states(jax.random.PRNGKey(3), 0, D_T)[0]
    loss = float(sentence_embedding_loss(other, mask(), identity(D_T), teacher_embedding))
    assert 0.0 < loss <= 2.0


def test_both_losses_fall_as_optax_fits_the_projections():
    """A student of another width (16) whose states carry the teacher's (24) through a fixed map plus
    noise: 60 Adam steps on the projections alone take both losses down (here 1.68 → 0.040 and 0.98 → 1.2e-4)."""
    key_s, key_map, key_noise, key_p = jax.random.split(jax.random.PRNGKey(4), 4)
    student = states(key_s, 4, D_S)
    mixing = jax.random.normal(key_map, (D_S, D_T))
    noise = states(key_noise, 6, D_T)
    pairs = layer_pairs(4, 6)
    teacher = [0.1 * n for n in noise]
    for s, t in pairs:
        teacher[t] = jnp.tanh(student[s] @ mixing) + 0.05 * noise[t]
    teacher = tuple(teacher)
    teacher_embedding = pool_sentence(teacher[-1], mask(), PoolingSpec(normalize=True))
    keys = jax.random.split(key_p, len(pairs) + 1)
    params = {
        "layers": [init_projection(k, D_S, D_T) for k in keys[:-1]],
        "sentence": init_projection(keys[-1], D_S, D_T),
    }

    def losses(p):
        hidden = hidden_state_loss(student, teacher, p["layers"], mask(), pairs, "mse")
        sentence = sentence_embedding_loss(student[-1], mask(), p["sentence"], teacher_embedding)
        return hidden, sentence

    optimizer = optax.adam(0.05)
    state = optimizer.init(params)

    @jax.jit
    def step(p, s):
        grads = jax.grad(lambda q: sum(losses(q)))(p)
        updates, s = optimizer.update(grads, s, p)
        return optax.apply_updates(p, updates), s

    hidden0, sentence0 = (float(x) for x in losses(params))
    for _ in range(60):
        params, state = step(params, state)
    hidden1, sentence1 = (float(x) for x in losses(params))
    assert hidden1 < 0.1 * hidden0, (hidden0, hidden1)
    assert sentence1 < 0.01 * sentence0, (sentence0, sentence1)
