"""Reading past the trained positions: the learned position table tiled, the one way the project does it.

A model with learned absolute positions reads at most `max_position_embeddings` tokens. Its table grows by
tiling the learned rows (the Longformer protocol the paper follows): row i of the longer table is row
i mod N of the learned one, so rows [0, N) are unchanged and a short input is answered exactly as before.
Three places grow it, all through `tile_positions`:

    bigs train extend       before it trains at the longer length (training/stages.py)
    bigs eval --lengths     with no training: the length test (training/evaluation.py `ArtifactModel`)
    bigs export --tile-positions   with no training: the export serves buckets past N (export/positions.py)

A model without a position table (ALiBi: positions are distance biases) has nothing to tile. A model tied to
N positions (`BiGSConfig.fixed_length`: a learned N × N matrix) cannot be read past N at all.
"""

from __future__ import annotations

import numpy as np

# config.json's record of a dir whose positions were tiled with no training: the N rows it learned. Written by
# `bigs export --tile-positions` beside the longer max_position_embeddings, so whatever reads the dir later (a
# re-export, the model card, `bigs eval --lengths`) knows which positions were trained.
POSITIONS_TILED_FROM = "positions_tiled_from"

# Where the table lives: the Flax tree (training) and the torch-layout state dict (a dir's model.safetensors;
# "bigs." prefixes the key, but not in a bare encoder saved by transformers itself).
FLAX_TABLE = ("s4_bert", "embeddings", "position_embeddings", "embedding")
TORCH_TABLE_SUFFIX = "embeddings.position_embeddings.weight"


def tile_positions(table: np.ndarray, new_length: int, tile_from: int | None = None) -> np.ndarray:
    """The (new_length, d) table: the learned (N, d) `table` repeated, rows [0, N) unchanged. `tile_from`:
    tile the first `tile_from` rows instead, over whatever the table held past them (a table tiled before).
    Where those rows already reach `new_length`, the table is returned as it is."""
    learned = table
    if tile_from is not None:
        if tile_from > table.shape[0]:
            raise ValueError(f"tile_positions_from={tile_from} is past the model's {table.shape[0]} positions")
        learned = table[:tile_from]
    old = learned.shape[0]
    if new_length <= old:
        return table
    return np.tile(learned, (-(-new_length // old), 1))[:new_length]


def extend_positions(params: dict, new_length: int, tile_from: int | None = None) -> dict:
    """Flax params with the learned position embeddings tiled up to `new_length` rows (`tile_positions`);
    as they are for a model without a position table."""
    import jax

    params = jax.tree_util.tree_map(np.asarray, params)
    embeddings = params[FLAX_TABLE[0]][FLAX_TABLE[1]]
    if FLAX_TABLE[2] not in embeddings:
        return params
    table = embeddings[FLAX_TABLE[2]]
    table[FLAX_TABLE[3]] = tile_positions(table[FLAX_TABLE[3]], new_length, tile_from)
    return params


def torch_table_key(state: dict) -> str | None:
    """The key of the position table in a torch-layout state dict; None when the model has none (ALiBi)."""
    keys = [key for key in state if key.endswith(TORCH_TABLE_SUFFIX)]
    if len(keys) > 1:
        raise ValueError(f"several position tables in one state dict: {keys}")
    return keys[0] if keys else None


def trained_positions(config: dict) -> int:
    """The positions a dir's model learned (its config.json as a dict): max_position_embeddings, or fewer where
    they were tiled past with no training (`POSITIONS_TILED_FROM`)."""
    return int(config.get(POSITIONS_TILED_FROM) or config["max_position_embeddings"])
