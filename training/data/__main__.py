"""`python -m training.data …`: build datasets from a shell (thin: parse, call one function).

python -m training.data list
python -m training.data corpus --sources linux-doc kjv ./my_texts --out data/mlm --seq-len 128
python -m training.data labelled --source bbc-news --out data/bbc --max-length 512
python -m training.data repack --out data/mlm --seq-len 512
"""

from __future__ import annotations

import argparse
import json

from training.data.corpus import build_corpus, build_labelled, repack
from training.data.sources import SOURCES


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m training.data", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("list", help="registered sources")
    c = sub.add_parser("corpus", help="packed MLM corpus")
    c.add_argument("--sources", nargs="+", required=True, help="registry names, paths or hf:name[:config]")
    c.add_argument("--out", required=True)
    c.add_argument("--seq-len", type=int, default=128)
    c.add_argument("--max-docs", type=int, default=None, help="per source, seeded subset")
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--cache-dir", default=None)
    c.add_argument("--overwrite", action="store_true")
    lab = sub.add_parser("labelled", help="classification set")
    lab.add_argument("--source", required=True)
    lab.add_argument("--out", required=True)
    lab.add_argument("--max-length", type=int, default=512)
    lab.add_argument("--max-docs", type=int, default=None)
    lab.add_argument("--seed", type=int, default=0)
    lab.add_argument("--cache-dir", default=None)
    lab.add_argument("--overwrite", action="store_true")
    r = sub.add_parser("repack", help="pack a built corpus at another length")
    r.add_argument("--out", required=True)
    r.add_argument("--seq-len", type=int, required=True)
    a = p.parse_args(argv)

    if a.cmd == "list":
        for s in SOURCES.values():
            print(f"{s.name:16} {'labelled' if s.labelled else 'text':9} {s.package:45} {s.description}")
        return
    if a.cmd == "corpus":
        card = build_corpus(
            a.sources, a.out, a.seq_len, a.max_docs, a.seed, cache_dir=a.cache_dir, overwrite=a.overwrite
        )
    elif a.cmd == "labelled":
        card = build_labelled(
            a.source, a.out, a.max_length, a.seed, max_docs=a.max_docs, cache_dir=a.cache_dir, overwrite=a.overwrite
        )
    else:
        card = repack(a.out, a.seq_len)
    print(json.dumps(card["splits"], indent=1))


if __name__ == "__main__":
    main()
