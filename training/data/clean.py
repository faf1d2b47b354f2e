"""Turn marked-up source text into the plain prose a masked-LM should see.

Markup is not language: `:c:func:` roles, section underlines, Sphinx directives, dictionary
accent codes and MIME headers would otherwise take a large share of the tokens, and the model
would spend capacity predicting them. Each cleaner keeps the words a reader sees on the rendered
page and drops what only a renderer needs (code listings too: they are not English and they
would dominate the technical sources).

Output convention for every cleaner: paragraphs separated by one blank line, the lines of a
paragraph joined by single spaces. `split_paragraphs` relies on it, and so do the word counts.
"""

from __future__ import annotations

import email
import email.header
import email.policy
import html
import re
from html.parser import HTMLParser

# ----------------------------------------------------------------------------------------- common


def normalize_whitespace(text: str) -> str:
    """Join the lines of each blank-line-separated paragraph; one blank line between paragraphs."""
    paras = re.split(r"\n\s*\n", text.replace("\r\n", "\n").replace("\r", "\n"))
    out = (" ".join(p.split()) for p in paras)
    return "\n\n".join(p for p in out if p)


def split_paragraphs(text: str) -> list[str]:
    return [p for p in (" ".join(b.split()) for b in re.split(r"\n\s*\n", text)) if p]


def word_count(text: str) -> int:
    return len(text.split())


_CODE_LINE = re.compile(
    r"""^\s*(
        [#]\s*(include|define|if|ifdef|ifndef|endif|else)\b   # C preprocessor
      | [{}]\s*;?\s*$                                         # lone braces
      | .*[{;]\s*$                                            # statements and block openers
      | [\w,.\-#&@/]+\s*=\s*[<"&\d(]                          # dts / shell / C assignments
      | (\$|\#)\s+\S                                          # shell prompts
      | [/]?\*+/?\s*$ | /\*.*                                 # C comments
    )""",
    re.X,
)


def looks_like_code(line: str) -> bool:
    """A plain-text line that is a code/config listing rather than prose (kernel .txt files)."""
    s = line.strip()
    if not s:
        return False
    if _CODE_LINE.match(s):
        return True
    letters = sum(c.isalpha() or c.isspace() for c in s)
    return len(s) >= 8 and letters / len(s) < 0.55


# ------------------------------------------------------------------------------------------- rST

# Directives whose body is code, configuration or navigation: drop the directive and its body.
_SKIP_DIRECTIVES = {
    "code-block",
    "code",
    "sourcecode",
    "literalinclude",
    "include",
    "toctree",
    "highlight",
    "kernel-doc",
    "kernel-feat",
    "kernel-abi",
    "kernel-include",
    "kernel-figure",
    "kernel-render",
    "math",
    "graphviz",
    "image",
    "raw",
    "productionlist",
    "doctest",
    "testcode",
    "testoutput",
    "testsetup",
    "testcleanup",
    "index",
    "module",
    "moduleauthor",
    "sectionauthor",
    "currentmodule",
    "program",
    "default-domain",
    "tabularcolumns",
    "contents",
    "sectnum",
    "only",
    "ifconfig",
    "csv-table",
    "literal",
    "parsed-literal",
    "c:namespace",
    "cpp:namespace",
    "c:namespace-push",
    "c:namespace-pop",
    "highlightlang",
    "autosummary",
    "automodule",
    "autoclass",
    "autofunction",
    "digraph",
    "pdb",
    "limited-api-list",
    "availability",
    "ssbullet",
    "audit-event-table",
    "role",
    "default-role",
    "meta",
    "title",
    "container",
}
# Directives whose argument is a title worth keeping as text (for the rest it is a signature).
_TITLE_DIRECTIVES = {
    "note",
    "warning",
    "attention",
    "caution",
    "danger",
    "error",
    "hint",
    "important",
    "tip",
    "admonition",
    "topic",
    "sidebar",
    "rubric",
    "seealso",
    "versionadded",
    "versionchanged",
    "deprecated",
    "deprecated-removed",
    "impl-detail",
    "epigraph",
    "highlights",
    "pull-quote",
}
_ADORNMENT = re.compile(r"""^\s*([=\-~^"'`*+#:._<>])\1{2,}\s*$""")
_BORDER_CHARS = frozenset("-=+| ")
_DIRECTIVE = re.compile(r"^(\s*)\.\.\s+([\w:.+-]+)::\s*(.*)$")
_EXPLICIT = re.compile(r"^(\s*)\.\.(\s|$)")
_FOOTNOTE = re.compile(r"^(\s*)\.\.\s+\[([#*\w-]*)\]\s*(.*)$")
_BULLET = re.compile(r"^(\s*)(?:[*+\-\u2022]|#\.|\(?\d{1,3}[.)]|\(?[a-zA-Z][.)])\s+(?=\S)")
_FIELD = re.compile(r"^(\s*):([^:`]+):(\s+|$)")


def _is_table_border(s: str) -> bool:
    """`+----+----+`, `====  ====` (grid and simple table borders)."""
    return set(s) <= _BORDER_CHARS and ("--" in s or "==" in s)


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def _role(m: re.Match) -> str:
    inner = m.group(1).strip()
    target = re.match(r"^(.*?)\s*<([^<>]*)>$", inner, re.S)
    if target:
        inner = target.group(1) or target.group(2)
    inner = inner.lstrip("!")
    if inner.startswith("~"):
        inner = inner[1:].rsplit(".", 1)[-1]
    return inner


def rst_inline(text: str) -> str:
    """Strip inline rST: roles, literals, links, emphasis, substitutions, footnote refs."""
    text = re.sub(r"``(.+?)``", r"\1", text)
    text = re.sub(r":(rfc|pep):`(\d+)[^`]*`", lambda m: f"{m.group(1).upper()} {m.group(2)}", text)
    text = re.sub(r":[\w:.+-]+:`([^`]*)`", _role, text)
    text = re.sub(r"`([^`]*)`:[\w:.+-]+:", _role, text)
    text = re.sub(r"`([^`<]*?)\s*<[^`>]*>`__?", lambda m: m.group(1), text)
    text = re.sub(r"`([^`]+)`__?", r"\1", text)
    text = re.sub(r"`([^`]+)`", _role, text)
    text = re.sub(r"\s?\[(#[\w-]*|\d+|\*)\]_", "", text)
    text = re.sub(r"(?<![\w*\\])\*\*(\S(?:.*?\S)?)\*\*(?![\w*])", r"\1", text)
    text = re.sub(r"(?<![\w*\\])\*(\S(?:.*?\S)?)\*(?![\w*])", r"\1", text)
    text = re.sub(r"(?<![\w|])\|([\w][\w -]*?)\|(?![\w|])", r"\1", text)
    text = re.sub(r"\\ ", "", text)  # escaped space: joins inline markup to a word
    text = re.sub(r"\\([*_`|\\])", r"\1", text)  # escaped markup characters
    return text


def _skip_block(lines: list[str], i: int, base: int) -> int:
    """Index of the first line after the block indented deeper than `base` that starts at i."""
    while i < len(lines) and (not lines[i].strip() or _indent(lines[i]) > base):
        i += 1
    return i


def rst_to_text(src: str, drop_code_lines: bool = False) -> str:
    """Plain prose from reStructuredText (kernel and Python docs dialects).

    Keeps headings, paragraphs, list items, admonition and API-description bodies, table cell
    text; drops directives with code/navigation bodies, literal blocks (`::`), doctests,
    comments, link targets, adornment lines, table borders and inline markup.
    """
    lines = src.expandtabs(8).replace("\r\n", "\n").split("\n")
    out: list[str] = []
    i, n = 0, len(lines)
    literal_indent: int | None = None  # indent of the paragraph that ended with "::"
    while i < n:
        line = lines[i].rstrip()
        stripped = line.strip()
        ind = _indent(line)
        if not stripped:
            out.append("")
            i += 1
            continue
        if literal_indent is not None and ind > literal_indent:  # the literal (code) block
            i = _skip_block(lines, i, literal_indent)
            literal_indent = None
            continue
        literal_indent = None
        m = _DIRECTIVE.match(line)
        if m:
            name = m.group(2).lower()
            arg = m.group(3).strip()
            j = i + 1
            # a signature continued with "\" or stacked signatures aligned under the first one
            arg_col = len(line) - len(m.group(3)) if m.group(3) else -1
            while j < n and lines[j].strip() and (lines[j - 1].rstrip().endswith("\\") or _indent(lines[j]) == arg_col):
                j += 1
            # directive options (":maxdepth: 2") follow directly, indented
            while j < n and lines[j].strip() and _indent(lines[j]) > ind and _FIELD.match(lines[j]):
                j += 1
            if name in _SKIP_DIRECTIVES or name.startswith(("auto", "kernel-")):
                i = _skip_block(lines, j, ind)
                continue
            if name in _TITLE_DIRECTIVES and arg and not re.match(r"^[\d.]+$", arg):
                out += ["", arg, ""]
            i = j
            continue
        fm = _FOOTNOTE.match(line)
        if fm:  # footnote/citation: keep its text, drop the label
            out += ["", fm.group(3)]
            i += 1
            continue
        if _EXPLICIT.match(line):  # comment, link target, substitution definition
            i = _skip_block(lines, i + 1, ind)
            continue
        if _ADORNMENT.match(line) or _is_table_border(stripped):
            out.append("")  # a heading ends here (or a table row): keep it a paragraph of its own
            i += 1
            continue
        if stripped.startswith((">>>", "... ")) or stripped == "...":
            i += 1
            continue
        if drop_code_lines and looks_like_code(line):
            i += 1
            continue
        text = line
        if stripped.startswith("|"):  # table row or line block: cells become phrases
            text = " ".join(c.strip() for c in stripped.strip("|").split("|") if c.strip())
        bm = _BULLET.match(text)
        if bm:
            out.append("")  # every list item starts a paragraph
            text = text[bm.end() :]
        fm2 = _FIELD.match(text)
        if fm2:
            text = f"{fm2.group(2)}: {text[fm2.end() :]}"
        text = text.strip()
        if text.endswith("::"):
            literal_indent = ind
            text = text[:-2].rstrip()
            text = text + ":" if text and not text.endswith(":") else text
        out.append(text)
        i += 1
    # inline markup can span lines, so it is stripped per paragraph
    return "\n\n".join(rst_inline(p) for p in split_paragraphs("\n".join(out)))


def plain_text_doc(src: str) -> str:
    """Kernel .txt documents: no markup language, but adornments, tables and code listings."""
    return rst_to_text(src, drop_code_lines=True)


# ------------------------------------------------------------------------------------------ HTML


class _TextExtractor(HTMLParser):
    _BLOCK = {"p", "div", "br", "li", "tr", "h1", "h2", "h3", "h4", "h5", "h6", "table", "ul", "ol"}
    _SKIP = {"script", "style", "head", "title"}

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.skip = 0

    def handle_starttag(self, tag, attrs):
        if tag in self._SKIP:
            self.skip += 1
        elif tag in self._BLOCK:
            self.parts.append("\n\n")

    def handle_endtag(self, tag):
        if tag in self._SKIP and self.skip:
            self.skip -= 1
        elif tag in self._BLOCK:
            self.parts.append("\n\n")

    def handle_data(self, data):
        if not self.skip:
            self.parts.append(data)


def html_to_text(src: str) -> str:
    parser = _TextExtractor()
    try:
        parser.feed(src)
        parser.close()
    except Exception:  # malformed HTML in the wild: fall back to stripping tags
        return normalize_whitespace(html.unescape(re.sub(r"<[^>]+>", " ", src)))
    return normalize_whitespace("".join(parser.parts))


# ----------------------------------------------------------------------------------------- email


def email_to_text(raw: bytes) -> tuple[str, str]:
    """(subject, body text) of a raw RFC 822 message.

    Only the Subject and the human-readable parts are kept: the other headers (relays, spam
    filter verdicts, list footers' X- fields) would let a classifier learn the mail server, not
    the message.
    """
    msg = email.message_from_bytes(raw, policy=email.policy.compat32)
    subject = _decode_header(msg.get("Subject", ""))
    plain, htmls = [], []
    for part in msg.walk():
        if part.is_multipart() or part.get_content_maintype() != "text":
            continue
        if (part.get("Content-Disposition") or "").lower().startswith("attachment"):
            continue
        payload = part.get_payload(decode=True) or b""
        charset = part.get_content_charset() or "latin-1"
        try:
            text = payload.decode(charset, errors="replace")
        except LookupError:
            text = payload.decode("latin-1", errors="replace")
        (htmls if part.get_content_subtype() == "html" else plain).append(text)
    body = normalize_whitespace("\n\n".join(plain)) if plain else "\n\n".join(map(html_to_text, htmls))
    return normalize_whitespace(subject), body


def _decode_header(value: str) -> str:
    try:
        parts = email.header.decode_header(value)
    except Exception:
        return str(value)
    out = []
    for chunk, charset in parts:
        if isinstance(chunk, bytes):
            try:
                chunk = chunk.decode(charset or "latin-1", errors="replace")
            except LookupError:
                chunk = chunk.decode("latin-1", errors="replace")
        out.append(chunk)
    return "".join(out)


# ----------------------------------------------------------------------------------------- GCIDE

# Source attributions closing each sense ("[1913 Webster]", "[WordNet 1.5 +PJC]"): provenance,
# not text.
_GCIDE_SOURCE = re.compile(
    r"\[\s*(?:\+?\s*(?:1913 Webster|Webster 1913 Suppl\.|Webster|WordNet(?: \d\.\d)?(?: sense \d+)?"
    r"|PJC\.?|AS|RDH|RHUD|MW10|MI11|GG|wn1|Century Dict\.(?: 1906)?|Century|JRC|DC|JC)\s*)+\]"
)
# Named character codes of the GCIDE markup -> plain characters.
_GCIDE_NAMED = {
    "imac": "i",
    "aum": "a",
    "eth": "th",
    "thorn": "th",
    "root": "",
    "add": "",
    "asl": "a",
    "ng": "ng",
    "deg": " degrees",
    "sect": "section",
    "udd": "u",
    "yogh": "gh",
    "oe": "oe",
    "ae": "ae",
    "AE": "AE",
    "OE": "OE",
    "oo": "oo",
    "th": "th",
    "dsdot": "d",
    "bprime": "'",
    "pounds": "pounds",
    "nbsp": " ",
    "middot": " ",
    "rarr": "->",
    "para": "",
    "times": "x",
    "divby": "/",
    "div": "/",
    "ldqo": '"',
    "zdot": "z",
    "sb": "",
    "break": "",
    "hand": "",
    "flat": "flat",
    "sharp": "sharp",
    "min": "'",
    "sec": '"',
    "bar": "",
    "prime": "'",
    "alpha": "alpha",
    "beta": "beta",
    "gamma": "gamma",
    "delta": "delta",
    "epsilon": "epsilon",
    "eta": "eta",
    "theta": "theta",
    "iota": "iota",
    "kappa": "kappa",
    "lambda": "lambda",
    "mu": "mu",
    "pi": "pi",
    "rho": "rho",
    "sigma": "sigma",
    "tau": "tau",
    "upsilon": "upsilon",
    "phi": "phi",
    "chi": "chi",
    "omicron": "omicron",
    "digamma": "digamma",
}
_GCIDE_ACCENT = re.compile(r"""\[(?:[`'"=.~\-^,*]{0,2})([a-zA-Z]{1,2})(?:\^)?\]""")


def _gcide_code(m: re.Match) -> str:
    code = m.group(0)[1:-1]
    if code in _GCIDE_NAMED:
        return _GCIDE_NAMED[code]
    if code.lower() in _GCIDE_NAMED and code[0].isupper() and len(code) > 2:  # Greek capitals
        return _GCIDE_NAMED[code.lower()].capitalize()
    am = _GCIDE_ACCENT.fullmatch(m.group(0))
    if am and (code[0] in "`'\"=.~-^,*" or code.endswith("^")):
        return am.group(1)
    return m.group(0)


def gcide_to_text(entry: str) -> str:
    """One dictionary entry of the dictd GCIDE file as readable text.

    `Bal*loon"ing \\Bal*loon"ing\\, n.` → `Ballooning, n.`; `{Teach}` → `Teach`; accent codes
    `[=a]` → `a`; source tags `[1913 Webster]` dropped; attributions `--Shak.` kept as text.
    """
    text = _GCIDE_SOURCE.sub("", entry)
    text = re.sub(r"[ \t]*\\[^\\\n]*\\", "", text)  # pronunciations \Bal*loon"ing\
    text = re.sub(r"\[[^\]\s]{1,8}\]", _gcide_code, text)
    text = re.sub(r"[{}]", "", text)
    text = re.sub(r"(?<=\w)\*(?=\w)", "", text)  # syllable dots in headwords
    text = re.sub(r"\s--\s*(?=[A-Z])", " — ", text)  # "--Macaulay."
    # A sense starts a paragraph: "1. (a) ..." lines begin with a number.
    text = re.sub(r"\n(\s*)(\d+\.\s)", r"\n\n\1\2", text)
    return normalize_whitespace(text)


# ---------------------------------------------------------------------------------- Brown / tweets

_BROWN_QUOTES = {"``": '"', "''": '"'}


def brown_untag(tagged: str) -> str:
    """`The/at jury/nn said/vbd ./.` → `The jury said.` (POS tags off, tokens detokenized)."""
    sentences = []
    for line in tagged.splitlines():
        toks = [t.rsplit("/", 1)[0] for t in line.split() if "/" in t]
        if not toks:
            continue
        toks = [_BROWN_QUOTES.get(t, t) for t in toks]
        sentences.append(detokenize(toks))
    return " ".join(sentences)


def detokenize(tokens: list[str]) -> str:
    """Join Penn/Brown-style tokens with English spacing (no space before , . ; : ? ! ) ')."""
    out: list[str] = []
    quote_open = False
    for t in tokens:
        if t == '"':
            if quote_open:
                out.append('"')  # glue to the previous word
            else:
                out.append(' "')
                out.append("")  # next token glues to the opening quote
            quote_open = not quote_open
            continue
        if (
            re.fullmatch(r"[,.;:?!)\]}%]+|'s|'|n't|'re|'ll|'ve|'d|'m", t)
            or not out
            or out[-1] == ""
            or (out[-1].endswith(("(", "[", "{", "$")))
        ):
            out.append(t)
        else:
            out.append(" " + t)
    return "".join(out).strip()


_MOJIBAKE = re.compile(r"[_\x80-\uffff]*[\x80-\uffff][_\x80-\uffff]*")


def clean_tweet(raw: bytes | str) -> str:
    """Tweets from a corpus whose non-ASCII characters were mangled beyond repair.

    Mangled runs between two letters stood for an apostrophe (`don’t` → `don'Õ¢_ŠÎ_†¢t`); any
    other run is dropped. HTML entities are unescaped.
    """
    text = raw.decode("latin-1") if isinstance(raw, bytes) else raw

    def fix(m: re.Match) -> str:
        s, e = m.start(), m.end()
        between_letters = s > 0 and e < len(text) and text[s - 1].isalnum() and text[e].isalpha()
        return "'" if between_letters else " "

    text = _MOJIBAKE.sub(fix, text)
    return " ".join(html.unescape(text).split())
