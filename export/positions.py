"""`bigs export --tile-positions`: an export dir that reads past the model's positions, its table tiled.

A BiGS model reads at most its `max_position_embeddings` learned positions, but its cost grows with length
as an FFT does, and the length test (`bigs eval --lengths`) shows what its accuracy does past them with the
learned table tiled and no training. Asked to, `bigs export` writes such a model: the export dir's
model.safetensors gets the position table tiled up to the longest bucket (model/positions.py
`tile_positions`, what `bigs train extend` does before it trains), and its config.json the longer
max_position_embeddings and the positions it learned (`POSITIONS_TILED_FROM`). Everything after reads the dir:
the torch reference, the ONNX graphs traced from it, the StableHLO built from its weights, parity, the gates,
`--verify`, the torch runtime and stock transformers, so all of them see the one tiled table. The manifest
records it (`ModelInfo.positions_tiled_from`) and the model card says it.

The artifact dir itself is never changed: tiling in place is refused.
"""

from __future__ import annotations

import json
from pathlib import Path

from model.hub import CONFIG, write_json
from model.positions import POSITIONS_TILED_FROM, tile_positions, torch_table_key, trained_positions

WEIGHTS = "model.safetensors"


def tile_dir_positions(model_dir: str | Path, length: int) -> int:
    """Tile the position table of `model_dir` (an export dir's copy of the artifact) up to `length` rows, in its
    weights file, and say so in its config.json; returns the positions the model learned. Rows past those are
    copies of them: a dir tiled before is tiled again from its learned rows, not from the copies."""
    from safetensors import safe_open
    from safetensors.numpy import load_file, save_file

    model_dir = Path(model_dir)
    config = json.loads((model_dir / CONFIG).read_text())
    if config.get("routing") == "alibi":
        raise ValueError("this model has no position table to tile (routing alibi: positions are distance "
                         "biases of its attention); it is exported up to its max_position_embeddings")  # fmt: skip
    if not (model_dir / WEIGHTS).is_file():
        raise ValueError(f"{model_dir} has no {WEIGHTS}: positions are tiled in the safetensors weights file")
    learned = trained_positions(config)
    # The weights as stored (fp16 storage stays fp16: tiling copies rows, it computes nothing), with their metadata.
    state = load_file(str(model_dir / WEIGHTS))
    with safe_open(str(model_dir / WEIGHTS), framework="numpy") as f:
        metadata = f.metadata()
    key = torch_table_key(state)
    if key is None:
        raise ValueError(f"{model_dir}/{WEIGHTS} holds no position table (no key ending in embeddings.position_"
                         "embeddings.weight)")  # fmt: skip
    state[key] = tile_positions(state[key], length, tile_from=learned)
    save_file(state, str(model_dir / WEIGHTS), metadata=metadata)

    config["max_position_embeddings"] = length
    config[POSITIONS_TILED_FROM] = learned
    write_json(model_dir / CONFIG, config)  # as transformers writes it: indent 2, sorted keys
    return learned


def describe_tiling(learned: int, length: int) -> str:
    """The line `bigs export` prints, and the model card's: what the positions past `learned` are."""
    return (
        f"positions {learned + 1:,} to {length:,} are the model's {learned:,} learned positions tiled, with no "
        f"training (bigs export --tile-positions; `bigs eval --lengths` measures what that costs)"
    )
