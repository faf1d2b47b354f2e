"""Prompts put before a text to embed, by name, as sentence-transformers and text-embeddings-inference do.

A model dir may carry sentence-transformers' `config_sentence_transformers.json` with `prompts`
({name: text}, e.g. {"query": "query: ", "document": ""}) and `default_prompt_name`. A request's
`prompt_name` puts that prompt before each of its texts; with none, the default prompt is put there
when the dir names one (sentence-transformers' `encode` and TEI do the same). A name the dir does not
have is 422, naming those it has. Token-id inputs are the model's whole input as given: no prompt.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from .errors import ServiceError

CONFIG = "config_sentence_transformers.json"


@dataclass(frozen=True)
class Prompts:
    by_name: dict[str, str] = field(default_factory=dict)
    default_name: str | None = None

    @classmethod
    def of(cls, model_dir: Path) -> Prompts:
        """The dir's prompts; none when it has no sentence-transformers config. A config whose default
        names no prompt of it is an error (the model would be served with a prompt it does not have)."""
        path = Path(model_dir) / CONFIG
        if not path.is_file():
            return cls()
        config = json.loads(path.read_text())
        prompts = config.get("prompts") or {}
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in prompts.items()):
            raise ValueError(f"{path}: prompts must map names to texts")
        default = config.get("default_prompt_name")
        if default is not None and default not in prompts:
            raise ValueError(f"{path}: default_prompt_name {default!r} is not one of its prompts {sorted(prompts)}")
        return cls(dict(prompts), default)

    def prompt(self, name: str | None) -> str:
        """The text put before each input for `name` (None: the default prompt, or none); 422 for a name
        this model has no prompt of."""
        if name is None:
            return self.by_name[self.default_name] if self.default_name is not None else ""
        if name not in self.by_name:
            have = f"its prompts are {sorted(self.by_name)}" if self.by_name else f"it has no prompts ({CONFIG})"
            raise ServiceError(422, "validation", f"prompt_name {name!r} is not a prompt of this model: {have}")
        return self.by_name[name]

    def apply(self, items: list, name: str | None) -> list:
        """The inputs with the prompt before each text (token-id lists unchanged)."""
        prompt = self.prompt(name)
        if not prompt:
            return items
        return [prompt + item if isinstance(item, str) else item for item in items]
