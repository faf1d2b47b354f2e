"""The tokenizer of BiGS: BERT uncased WordPiece (30,522 entries), carried inside the package.

The vocab file ships with the project (model/assets/), so building the tokenizer needs no hub.
Artifact dirs carry `tokenizer.json` + `tokenizer_config.json`, so both
`transformers.AutoTokenizer.from_pretrained(dir)` and `tokenizers.Tokenizer.from_file(...)` (the
service, which has no transformers) load it offline.
"""

from __future__ import annotations

from pathlib import Path

BERT_UNCASED_VOCAB = Path(__file__).parent / "assets" / "bert-base-uncased-vocab.txt"

# Long documents are the point of BiGS: the tokenizer must not cut inputs at BERT's 512.
DEFAULT_MAX_LENGTH = 4096


def read_vocab(path: str | Path = BERT_UNCASED_VOCAB) -> dict[str, int]:
    """One token per line, id = line number (the WordPiece vocab.txt format)."""
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    return {token: i for i, token in enumerate(lines)}


def bert_uncased_tokenizer(vocab_path: str | Path = BERT_UNCASED_VOCAB, model_max_length: int = DEFAULT_MAX_LENGTH):
    """A transformers `BertTokenizer` (tokenizers-backed) over the given WordPiece vocab."""
    from transformers import BertTokenizer

    return BertTokenizer(vocab=read_vocab(vocab_path), do_lower_case=True, model_max_length=model_max_length)


def save_tokenizer(out_dir: str | Path, tokenizer=None, model_max_length: int = DEFAULT_MAX_LENGTH) -> list[str]:
    """Write tokenizer files into an artifact dir; returns the file names written."""
    tokenizer = tokenizer or bert_uncased_tokenizer(model_max_length=model_max_length)
    return [Path(f).name for f in tokenizer.save_pretrained(str(out_dir))]
