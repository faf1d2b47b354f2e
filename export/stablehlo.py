"""Flax model → StableHLO, one serialized `jax.export.Exported` per (head, length bucket).

Each artifact is `stablehlo/<head>_<bucket>.bin` = `exported.serialize()` of a jitted function

    f(params, input_ids, attention_mask, token_type_ids[, mask_positions]) → outputs

over the Flax model of model/modeling_flax_bigs.py, with a symbolic batch dimension `b` (and `p`,
the number of mask positions, for fill-mask) and the sequence length fixed to the bucket: the
Flax SSM uses an FFT, whose length must be static (docs/DESIGN.md §3.4). Input ids are int32 (JAX without
x64).

Weights are arguments by default: `params` is a flat list whose order and provenance the manifest
records (`params`: the safetensors key of each leaf and whether it is transposed), so a runtime
rebuilds it from the export dir's model.safetensors with no model code (export/stablehlo_runtime.py),
and the ~100 KB artifacts of every bucket share one copy of the weights. `embed_weights=True`
closes over them instead: self-contained artifacts, each as large as the model.

Heads: fill-mask → logits (b, p, vocab) at `mask_positions`; classification → logits
(b, num_labels); embeddings → mean of the last hidden state over real tokens (b, d), before the
pooler, as in the ONNX graphs, then the dir's 2_Dense when it has one (b, d_out); token-embeddings →
that last hidden state itself (b, L, h). The Dense's
kernel and bias are parameters like the others, read from 2_Dense/model.safetensors (the
manifest's `file` of each leaf).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from model.configuration_bigs import BiGSConfig
from model.convert import flax_path_to_torch_key, torch_to_flax
from model.hub import DENSE_BIAS_KEY, DENSE_WEIGHT_KEY, DENSE_WEIGHTS, Dense
from model.modeling_flax_bigs import (
    FlaxBiGSForMaskedLMModule,
    FlaxBiGSForQuestionAnsweringModule,
    FlaxBiGSForSequenceClassificationModule,
    FlaxBiGSForTokenClassificationModule,
    FlaxBiGSModule,
    mean_pool,
)

from .heads import MASK_POSITIONS, SEQUENCE_INPUTS, heads_for, signature
from .manifest import StableHLOSection

PLATFORMS = ("cpu", "cuda", "tpu")  # lowered for all where this jax can; cpu alone otherwise
# The precision every matrix product of an fp32 artifact is lowered with. XLA's DEFAULT is fp32 on
# the CPU but TF32 on NVIDIA GPUs (bf16 passes on TPUs): the same artifact measured on an H100 missed
# the export's parity tolerance (fill-mask logits 1.7e-4 of their scale against 1e-4), while torch's
# fp32 on the same GPU held it. HIGHEST writes the fp32 product into the graph itself, so the answer
# of an fp32 artifact does not depend on where it runs; reduced precision is a variant of its own.
MATMUL_PRECISION = "highest"
INPUT_DTYPE = jnp.int32
# The Dense's leaves in the embeddings head's parameter tree, beside the backbone's: a name no
# backbone module has, so the two never mix.
DENSE_PARAMS = "2_Dense"


# --------------------------------------------------------------------------------------------
# Heads as pure functions of (params tree, inputs)
# --------------------------------------------------------------------------------------------


def head_spec(
    config: BiGSConfig, head: str, dense: Dense | None = None
) -> tuple[Callable, Callable[[Mapping], dict], tuple, tuple]:
    """(apply(tree, *inputs) → outputs, select(full tree) → the subtree the head needs, input names,
    output names); names as export/heads.py defines them. `dense`: the dir's Dense, which the
    embeddings head applies after the mean."""
    sig = signature(head)

    def without_pooler(tree):
        return {k: v for k, v in tree["s4_bert"].items() if k != "pooler"}

    if head == "fill-mask":
        module = FlaxBiGSForMaskedLMModule(config)

        def apply(tree, input_ids, attention_mask, token_type_ids, mask_positions):
            logits = module.apply(
                {"params": tree}, input_ids, attention_mask, token_type_ids, logits_positions=mask_positions
            )
            return {sig.output: logits}

        return (
            apply,
            lambda full: {"s4_bert": without_pooler(full), "cls": full["cls"]},
            sig.inputs,
            (sig.output,),
        )
    if head == "classification":
        module = FlaxBiGSForSequenceClassificationModule(config)

        def apply(tree, input_ids, attention_mask, token_type_ids):
            return {sig.output: module.apply({"params": tree}, input_ids, attention_mask, token_type_ids)}

        return (
            apply,
            lambda full: {"s4_bert": full["s4_bert"], "classifier": full["classifier"]},
            sig.inputs,
            (sig.output,),
        )
    if head in ("question-answering", "token-classification"):
        qa = head == "question-answering"
        module = (FlaxBiGSForQuestionAnsweringModule if qa else FlaxBiGSForTokenClassificationModule)(config)
        dense = "qa_outputs" if qa else "classifier"

        def apply(tree, input_ids, attention_mask, token_type_ids):
            out = module.apply({"params": tree}, input_ids, attention_mask, token_type_ids)
            return {sig.output: jnp.stack(out, axis=-1) if qa else out}  # QA: (b, L, 2), start then end

        return apply, lambda full: {"s4_bert": without_pooler(full), dense: full[dense]}, sig.inputs, (sig.output,)
    if head == "embeddings":
        module = FlaxBiGSModule(config, add_pooling_layer=False)

        def apply(tree, input_ids, attention_mask, token_type_ids):
            backbone = {k: v for k, v in tree.items() if k != DENSE_PARAMS}
            X, _, _ = module.apply({"params": backbone}, input_ids, attention_mask, token_type_ids)
            pooled = mean_pool(X, attention_mask)
            if DENSE_PARAMS in tree:
                pooled = pooled @ tree[DENSE_PARAMS]["kernel"] + tree[DENSE_PARAMS]["bias"]
            return {sig.output: pooled}

        def select(full):
            tree = without_pooler(full)
            if dense is not None:  # the kernel (in, out), as Flax stores a Dense: x @ kernel
                tree[DENSE_PARAMS] = {"kernel": dense.weight.T, "bias": dense.bias}
            return tree

        return apply, select, sig.inputs, (sig.output,)
    if head == "token-embeddings":  # the hidden state the embeddings pool, at every position: no Dense
        module = FlaxBiGSModule(config, add_pooling_layer=False)

        def apply(tree, input_ids, attention_mask, token_type_ids):
            X, _, _ = module.apply({"params": tree}, input_ids, attention_mask, token_type_ids)
            return {sig.output: X}

        return apply, without_pooler, sig.inputs, (sig.output,)
    raise ValueError(f"unknown head {head!r}")


def flatten_params(tree: Mapping, prefix: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], np.ndarray]]:
    """Leaves in a fixed (sorted) order with their paths."""
    leaves = []
    for key in sorted(tree):
        value = tree[key]
        if isinstance(value, Mapping):
            leaves.extend(flatten_params(value, prefix + (str(key),)))
        else:
            leaves.append((prefix + (str(key),), np.asarray(value, dtype=np.float32)))
    return leaves


def unflatten(paths: list[tuple[str, ...]], leaves) -> dict:
    tree: dict = {}
    for path, leaf in zip(paths, leaves, strict=True):
        node = tree
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = leaf
    return tree


def param_layout(head_tree: Mapping, root: tuple[str, ...]) -> list[dict]:
    """Per leaf: the safetensors key it comes from, whether it is transposed, shape and dtype.

    `root` is the path of the head's subtree inside the full Flax tree (empty, or ("s4_bert",) for
    the embeddings head, whose tree is the backbone alone)."""
    layout = []
    for path, array in flatten_params(head_tree):
        leaf = {"path": "/".join(path), "shape": list(array.shape), "dtype": "float32"}
        if path[0] == DENSE_PARAMS:  # sentence-transformers' file: torch layout, weight (out, in)
            kernel = path[-1] == "kernel"
            leaf.update(file=DENSE_WEIGHTS, key=DENSE_WEIGHT_KEY if kernel else DENSE_BIAS_KEY, transpose=kernel)
        else:
            key, transpose = flax_path_to_torch_key(root + path)
            leaf.update(key=key, transpose=transpose)
        layout.append(leaf)
    return layout


# --------------------------------------------------------------------------------------------
# Export
# --------------------------------------------------------------------------------------------


def input_specs(length: int, input_names: tuple) -> list[jax.ShapeDtypeStruct]:
    b, p = jax.export.symbolic_shape("b, p")
    specs = [jax.ShapeDtypeStruct((b, length), INPUT_DTYPE) for _ in SEQUENCE_INPUTS]
    if MASK_POSITIONS in input_names:
        specs.append(jax.ShapeDtypeStruct((b, p), INPUT_DTYPE))
    return specs


def export_one(config, head, length, head_tree, embed_weights: bool, platforms) -> jax.export.Exported:
    with jax.default_matmul_precision(MATMUL_PRECISION):  # resolved when traced: written into the graph
        return _export_one(config, head, length, head_tree, embed_weights, platforms)


def _export_one(config, head, length, head_tree, embed_weights: bool, platforms) -> jax.export.Exported:
    apply, _, input_names, output_names = head_spec(config, head)  # apply needs no Dense: it is in head_tree
    leaves = flatten_params(head_tree)
    paths = [p for p, _ in leaves]
    inputs = input_specs(length, input_names)
    if embed_weights:
        constants = unflatten(paths, [jnp.asarray(a) for _, a in leaves])

        def fn(*args):
            out = apply(constants, *args)
            return tuple(out[n] for n in output_names)

        return jax.export.export(jax.jit(fn), platforms=platforms)(*inputs)

    def fn(params, *args):
        out = apply(unflatten(paths, params), *args)
        return tuple(out[n] for n in output_names)

    param_specs = [jax.ShapeDtypeStruct(a.shape, jnp.float32) for _, a in leaves]
    return jax.export.export(jax.jit(fn), platforms=platforms)(param_specs, *inputs)


def export_stablehlo(
    config: BiGSConfig,
    state_dict: Mapping[str, np.ndarray],
    architecture: str,
    buckets: list[int],
    out_dir: Path,
    embed_weights: bool = False,
    dense: Dense | None = None,
    done: Callable[[str, int], object] | None = None,
) -> StableHLOSection:
    """Write stablehlo/<head>_<bucket>.bin for every head and bucket; returns the manifest section.
    `dense`: the dir's Dense (model/hub.py `read_dense`), applied by the embeddings head. `done(head,
    bucket)` is called as each file is written (the export's progress lines)."""
    hlo_dir = out_dir / "stablehlo"
    hlo_dir.mkdir(parents=True, exist_ok=True)
    full_tree = torch_to_flax(state_dict)
    platforms, platform_note = list(PLATFORMS), None
    section = {"weights": "embedded" if embed_weights else "arguments", "heads": {}}
    for head in heads_for(architecture):
        _, select, input_names, output_names = head_spec(config, head, dense)
        head_tree = select(full_tree)
        root = ("s4_bert",) if head in ("embeddings", "token-embeddings") else ()
        entry = {
            "inputs": [
                {"name": n, "dtype": "int32", "shape": ["b", "p" if n == MASK_POSITIONS else "L"]} for n in input_names
            ],
            "outputs": list(output_names),
            "params": None if embed_weights else param_layout(head_tree, root),
            "buckets": {},
        }
        for length in buckets:
            try:
                exported = export_one(config, head, length, head_tree, embed_weights, tuple(platforms))
            except Exception as error:  # this jax cannot lower for an accelerator: cpu only
                if platforms == ["cpu"]:
                    raise
                platforms, platform_note = ["cpu"], f"{type(error).__name__}: {str(error)[:300]}"
                exported = export_one(config, head, length, head_tree, embed_weights, ("cpu",))
            path = hlo_dir / f"{head}_{length}.bin"
            path.write_bytes(exported.serialize())
            entry["buckets"][str(length)] = {
                "file": f"stablehlo/{path.name}",
                "platforms": list(exported.platforms),
                "in_shapes": [str(a) for a in exported.in_avals],
                "out_shapes": [str(a) for a in exported.out_avals],
            }
            if done is not None:
                done(head, length)
        section["heads"][head] = entry
    section["platforms"] = platforms
    if platform_note:
        section["platform_fallback"] = platform_note
    return StableHLOSection.model_validate(section)
