"""A model dir's files for stock tools and the Hub, written: model/hub.py's, and the model card.

The card (README.md, `model_card` in model/hub.py) says what the export records too: the precisions the dir
refuses and its int8 floor (export/manifest.py `read_refusals`, `read_int8_floor`), and its positions tiled
past those it learned (export/positions.py). So it is written here, on the export's side, and model/hub.py,
which every model dir carries for `trust_remote_code`, imports nothing of the export.
"""

from __future__ import annotations

import json
from pathlib import Path

from model.hub import (
    CONFIG,
    EVALUATION,
    GENERATED,
    LIMITATIONS,
    MODEL_CARD,
    SERVED_EVALUATION,
    TRAINING_CARD,
    model_card,
    read_dense,
    write_remote_code,
    write_sentence_transformers_files,
)
from model.positions import POSITIONS_TILED_FROM

from .manifest import read_int8_floor, read_refusals
from .positions import describe_tiling


def write_model_card(out_dir: str | Path) -> bool:
    """Write README.md unless the dir holds one that was not written here; True when written."""
    out_dir = Path(out_dir)
    path = out_dir / MODEL_CARD
    if path.is_file() and GENERATED not in path.read_text(encoding="utf-8"):
        return False
    config = json.loads((out_dir / CONFIG).read_text())
    card_path = out_dir / TRAINING_CARD
    card = json.loads(card_path.read_text()) if card_path.is_file() else None
    notes = (
        ["pretraining_card.json records the stage before this one."]
        if (out_dir / "pretraining_card.json").is_file()
        else []
    )
    if config.get(POSITIONS_TILED_FROM):  # an export read past its positions (export/positions.py)
        learned, length = config[POSITIONS_TILED_FROM], config["max_position_embeddings"]
        notes.append(f"Read past its trained length: {describe_tiling(learned, length)}.")
    # training writes RUN_DIR/artifact (training/stages.py): the run names the model there
    name = out_dir.resolve().name if out_dir.resolve().name != "artifact" else out_dir.resolve().parent.name
    evaluation = json.loads((out_dir / EVALUATION).read_text()) if (out_dir / EVALUATION).is_file() else None
    served_path = out_dir / SERVED_EVALUATION
    served = json.loads(served_path.read_text()) if served_path.is_file() else None
    limitations = (out_dir / LIMITATIONS).read_text(encoding="utf-8") if (out_dir / LIMITATIONS).is_file() else None
    refused = {precision: r.why() for precision, r in read_refusals(out_dir).items()}
    floor = read_int8_floor(out_dir)
    card_text = model_card(
        name, config, card, notes, read_dense(out_dir), evaluation, limitations, served, refused,
        None if floor is None else floor.why(),
    )  # fmt: skip
    path.write_text(card_text, encoding="utf-8")
    return True


def write_hub_files(out_dir: str | Path) -> list[str]:
    """model/hub.py's remote code and sentence-transformers files, and the model card, into a dir that holds
    config.json; returns the files written."""
    written = write_remote_code(out_dir) + write_sentence_transformers_files(out_dir)
    if write_model_card(out_dir):
        written.append(MODEL_CARD)
    return written
