"""Real English text cut to exact token counts: the request texts of the load benchmarks.

    corpus = Corpus(load_tokenizer(""), stdlib_docstrings())
    text, tokens = corpus.document(125, random.Random(0))

The default text is the docstrings of the Python standard library (prose about many topics, shipped
with every Python); the tokenizer is the model's tokenizer.json or, by default, the BERT uncased vocab
in model/assets, which is what the models use. Used by bench/locustfile.py (`bigs bench load`),
bench/peer.py (`bigs bench peer`) and the throughput scripts. It imports no locust: locust
monkey-patches with gevent on import, which a process running asyncio or ORT's threads cannot take.
"""

from __future__ import annotations

import bisect
import importlib
import inspect
import random
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_VOCAB = REPO / "model" / "assets" / "bert-base-uncased-vocab.txt"
MIN_TOKENS = 2 * 4096  # room for two of the longest documents the load test sends

# Standard-library modules whose docstrings make the default corpus: prose about many topics.
CORPUS_MODULES = (
    "argparse asyncio.events asyncio.tasks base64 bisect calendar collections configparser contextlib copy "
    "csv datetime decimal difflib email.message email.utils enum fractions ftplib functools getopt gettext "
    "glob gzip hashlib heapq hmac html.parser http.client http.cookiejar http.server imaplib inspect "
    "io ipaddress itertools json locale logging logging.handlers mailbox mimetypes multiprocessing.pool "
    "netrc numbers operator optparse os pathlib pickle pickletools pkgutil platform poplib pprint "
    "queue random re sched secrets selectors shelve shlex shutil smtplib socket socketserver sqlite3 "
    "ssl statistics string struct subprocess tarfile tempfile textwrap threading timeit tokenize trace "
    "traceback turtle typing unittest.case unittest.mock urllib.parse urllib.request uuid warnings wave "
    "weakref xml.dom.minidom xml.etree.ElementTree zipfile zoneinfo"
)


def _paragraphs(text: str) -> list[str]:
    """Prose paragraphs: blank-line separated, at least 8 words, mostly letters (no code, no tables)."""
    out = []
    for block in re.split(r"\n\s*\n", text):
        lines = [line.strip() for line in block.splitlines()]
        if any(line.startswith((">>>", "...", "$", "|", "+-", "==")) for line in lines):
            continue
        para = " ".join(line for line in lines if line)
        words = para.split()
        if len(words) < 8:
            continue
        letters = sum(c.isalpha() or c.isspace() for c in para)
        if letters / len(para) >= 0.85:
            out.append(para)
    return out


def stdlib_docstrings() -> str:
    """The docstrings of CORPUS_MODULES and their public classes, functions and methods, in a fixed order."""
    docs, seen = [], set()
    for name in CORPUS_MODULES.split():
        try:
            module = importlib.import_module(name)
        except Exception:  # not every module is in every Python build (turtle needs tkinter)
            continue
        objects = [module] + [v for k, v in sorted(vars(module).items()) if not k.startswith("_")]
        for obj in objects:
            members = [obj]
            if inspect.isclass(obj):
                members += [v for k, v in sorted(vars(obj).items()) if not k.startswith("_")]
            for member in members:
                doc = inspect.getdoc(member) if callable(member) or inspect.ismodule(member) else None
                if doc and doc not in seen:
                    seen.add(doc)
                    docs.append(doc)
    return "\n\n".join(docs)


def load_tokenizer(path: str):
    from tokenizers import Tokenizer
    from tokenizers.implementations import BertWordPieceTokenizer

    if path:
        tokenizer = Tokenizer.from_file(path)
    elif DEFAULT_VOCAB.is_file():
        tokenizer = BertWordPieceTokenizer(str(DEFAULT_VOCAB), lowercase=True)
    else:
        raise SystemExit(f"no tokenizer: pass --tokenizer TOKENIZER_JSON (no {DEFAULT_VOCAB})")
    tokenizer.no_truncation()
    tokenizer.no_padding()
    return tokenizer


class Corpus:
    """Real text cut to exact token counts: one long token stream, sliced at word starts."""

    def __init__(self, tokenizer, text: str, seed: int = 0):
        self.tokenizer = tokenizer
        paragraphs = _paragraphs(text)
        random.Random(seed).shuffle(paragraphs)  # neighbouring slices come from unrelated modules
        self.text = "\n\n".join(paragraphs)
        enc = tokenizer.encode(self.text, add_special_tokens=False)
        self.offsets = enc.offsets
        words = enc.word_ids
        # word starts: a token whose word differs from the previous one (a cut there splits no word)
        self.starts = [i for i in range(len(words)) if i == 0 or words[i] != words[i - 1]]
        self.is_start = set(self.starts)
        single = [i for i in self.starts if i + 1 >= len(words) or words[i + 1] != words[i]]
        tokens = enc.tokens  # (each property access builds a new list)
        self.maskable = [i for i in single if tokens[i].isalpha() and len(tokens[i]) > 2]
        self.n = len(words)
        if self.n < MIN_TOKENS:
            raise SystemExit(f"the text corpus has {self.n} tokens: too few for {MIN_TOKENS // 2}-token documents")

    def length(self, text: str) -> int:
        return len(self.tokenizer.encode(text).ids)  # with [CLS] and [SEP], as the service counts

    def document(self, tokens: int, rng: random.Random, mask: bool = False) -> tuple[str, int]:
        """A text of `tokens` tokens with [CLS]/[SEP] (a few fewer where a cut would split a word);
        with `mask`, one whole-word token replaced by [MASK]. Returns (text, measured length)."""
        body = max(1, tokens - 2)
        first = bisect.bisect_left(self.starts, rng.randrange(max(1, self.n - body)))
        start = self.starts[min(first, len(self.starts) - 1)]
        end = min(start + body, self.n)
        while end < self.n and end not in self.is_start and end > start + 1:
            end -= 1
        a, b = self.offsets[start][0], self.offsets[end - 1][1]
        text = self.text[a:b]
        if mask:
            lo, hi = bisect.bisect_left(self.maskable, start), bisect.bisect_left(self.maskable, end)
            if hi > lo:
                i = self.maskable[rng.randrange(lo, hi)]
                text = text[: self.offsets[i][0] - a] + "[MASK]" + text[self.offsets[i][1] - a :]
            else:
                text += " [MASK]"
        return text, self.length(text)
