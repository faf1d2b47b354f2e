"""What a model dir needs so that stock tools load it with the project not installed (docs/DESIGN.md §1.2).

transformers           `auto_map` in config.json (AUTO_MAP) and the model's source files beside the
                       weights: `AutoModelForMaskedLM.from_pretrained(dir, trust_remote_code=True)` and
                       `pipeline("fill-mask", model=dir, trust_remote_code=True)` import the code from
                       the dir (transformers' dynamic modules), never a `model` package from sys.path.
sentence-transformers  modules.json, sentence_bert_config.json, 1_Pooling/config.json:
                       the service's embedding (the embeddings head, docs/DESIGN.md §1.4: the mean of
                       the last hidden state over real tokens, L2-normalised as /v1/embed does by default).
                       A dir MAY also carry 2_Dense/ (`Dense`, `write_dense`, `read_dense`): a linear map
                       of the pooled vector into another width, applied before the normalisation; then
                       modules.json lists it and the embeddings head applies it too.
the Hub                README.md, a model card with YAML front matter, from config.json and
                       training_card.json.

The source files are copied from this package at write time: the modeling module and every module it
imports relatively, found by transformers' own `get_relative_import_files`, i.e. exactly what its
loader will look for. This file is one of them (the config's `save_pretrained` calls it), so a model
loaded from a dir saves back into a dir that loads the same way.

Writers: every writer of an artifact or export dir ends with `write_hub_files` (export/hub_files.py: these
files and the card, which also reads what the export records; training/artifact.py, `bigs init`,
`bigs convert flax-to-torch`, export/build.py, `bigs hub-files DIR`), and
`BiGSConfig.save_pretrained` ends with `write_remote_code`, so any `save_pretrained` of a BiGS
model or config carries the code.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from huggingface_hub import ModelCardData
from safetensors.numpy import load_file, save_file
from transformers.dynamic_module_utils import get_relative_import_files

HERE = Path(__file__).resolve().parent
MODELING = HERE / "modeling_bigs.py"
CONFIG = "config.json"
TRAINING_CARD = "training_card.json"
MODEL_CARD = "README.md"
EVALUATION = "eval.json"  # `bigs eval DIR --json DIR/eval.json`: its held-out table goes into the model card
# `bigs eval EXPORT_DIR --precision auto --json DIR/eval-served.json`: the same sets scored on the export as
# `bigs serve` serves it (int8 or bf16 where their gates passed); the card sets its figures beside eval.json's
SERVED_EVALUATION = "eval-served.json"
LIMITATIONS = "limitations.md"  # what the model is bad at, in words, under the card's "Limitations"

# Each transformers Auto class → the BiGS class it builds, as "module.Class" of the files in the dir.
# model/__init__.py registers the same classes for in-process use.
AUTO_MAP = {
    "AutoConfig": "configuration_bigs.BiGSConfig",
    "AutoModel": "modeling_bigs.BiGSModel",
    "AutoModelForMaskedLM": "modeling_bigs.BiGSForMaskedLM",
    "AutoModelForSequenceClassification": "modeling_bigs.BiGSForSequenceClassification",
    "AutoModelForQuestionAnswering": "modeling_bigs.BiGSForQuestionAnswering",
    "AutoModelForTokenClassification": "modeling_bigs.BiGSForTokenClassification",
}

# The Hub's pipeline tag of each architecture. The bare encoder (BiGSModel) is an embedding model: it
# is tagged as sentence-transformers models on the Hub are (sentence-similarity, library
# sentence-transformers), since its use is the sentence embedding, not its hidden states.
EMBEDDING_ARCHITECTURE = "BiGSModel"
PIPELINE_TAGS = {
    EMBEDDING_ARCHITECTURE: "sentence-similarity",
    "BiGSForMaskedLM": "fill-mask",
    "BiGSForSequenceClassification": "text-classification",
    "BiGSForQuestionAnswering": "question-answering",
    "BiGSForTokenClassification": "token-classification",
}
LICENSE = "apache-2.0"  # the project's (pyproject.toml)

# A card carrying this line was written here and is rewritten; any other README.md is the user's, kept.
GENERATED = "<!-- model card written by `bigs hub-files` (model/hub.py) from config.json and training_card.json -->"


def code_files() -> list[Path]:
    """The source files transformers needs to import the model from a dir. Where this module was itself
    loaded from a dir's code for a config alone (`AutoConfig.from_pretrained(dir, trust_remote_code=True)`
    copies only the config's files), those are all there is: the config's."""
    root = MODELING if MODELING.is_file() else HERE / "configuration_bigs.py"
    return [root, *sorted({Path(p) for p in get_relative_import_files(root)})]


def write_json(path: Path, value) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value, indent=2, sort_keys=True) + "\n")


def write_remote_code(out_dir: str | Path) -> list[str]:
    """Copy the model's source files into `out_dir` and set `auto_map` in its config.json to the classes
    whose files the dir holds; returns the files written. Any earlier auto_map is replaced: these files
    are what loads the dir."""
    out_dir = Path(out_dir)
    written = []
    for source in code_files():
        target = out_dir / source.name
        if not (target.exists() and target.resolve() == source):
            shutil.copyfile(source, target)
        written.append(target.name)
    # A model saved after loading from a dir's code has its modeling file copied by transformers itself
    # (the class is registered for its Auto class) before the config is saved: it counts too.
    auto_map = {k: v for k, v in AUTO_MAP.items() if (out_dir / f"{v.split('.')[0]}.py").is_file()}
    config_path = out_dir / CONFIG
    config = json.loads(config_path.read_text())
    if config.get("auto_map") != auto_map:
        config["auto_map"] = auto_map
        write_json(config_path, config)  # as transformers writes it: indent 2, sorted keys
    return [*written, CONFIG]


# -- the optional Dense module -------------------------------------------------------------------
# sentence-transformers' own layout for `models.Dense` (its `save`): config.json and the nn.Linear's
# state dict. Only an identity activation is written or read: the embedding is then one affine map
# of the pooled vector, which every runtime computes exactly (a graph op, a jnp matmul, an nn.Linear).

DENSE_DIR = "2_Dense"
DENSE_WEIGHTS = f"{DENSE_DIR}/model.safetensors"
DENSE_CONFIG = f"{DENSE_DIR}/config.json"
DENSE_WEIGHT_KEY, DENSE_BIAS_KEY = "linear.weight", "linear.bias"
IDENTITY = "torch.nn.modules.linear.Identity"


@dataclass(frozen=True)
class Dense:
    """The pooled embedding's linear map d → out: `pooled @ weight.T + bias`, in torch's nn.Linear layout
    (weight (out, in)), which is how sentence-transformers stores it."""

    weight: np.ndarray  # (out_features, in_features)
    bias: np.ndarray  # (out_features,)

    def __post_init__(self):
        weight = np.ascontiguousarray(self.weight, dtype=np.float32)
        bias = np.ascontiguousarray(self.bias, dtype=np.float32)
        if weight.ndim != 2 or bias.shape != (weight.shape[0],):
            raise ValueError(f"Dense needs weight (out, in) and bias (out,); got {weight.shape} and {bias.shape}")
        object.__setattr__(self, "weight", weight)
        object.__setattr__(self, "bias", bias)

    @classmethod
    def from_kernel(cls, kernel: np.ndarray, bias: np.ndarray) -> Dense:
        """From a Flax/numpy kernel (in, out), applied as `x @ kernel + bias`."""
        return cls(np.asarray(kernel).T, bias)

    @property
    def in_features(self) -> int:
        return self.weight.shape[1]

    @property
    def out_features(self) -> int:
        return self.weight.shape[0]

    def __call__(self, pooled: np.ndarray) -> np.ndarray:
        return pooled @ self.weight.T + self.bias

    def config(self) -> dict:
        return {
            "in_features": self.in_features,
            "out_features": self.out_features,
            "bias": True,
            "activation_function": IDENTITY,
        }


def write_dense(out_dir: str | Path, dense: Dense | None) -> list[str]:
    """Write 2_Dense/ (config.json, model.safetensors), or with None remove any: a dir rewritten
    without a Dense must not keep an earlier one. Call `write_hub_files` after it, which lists the
    module in modules.json."""
    out_dir = Path(out_dir)
    if dense is None:
        shutil.rmtree(out_dir / DENSE_DIR, ignore_errors=True)
        return []
    write_json(out_dir / DENSE_CONFIG, dense.config())
    save_file({DENSE_WEIGHT_KEY: dense.weight, DENSE_BIAS_KEY: dense.bias}, str(out_dir / DENSE_WEIGHTS))
    return [DENSE_CONFIG, DENSE_WEIGHTS]


def read_dense(model_dir: str | Path) -> Dense | None:
    """The dir's Dense, None when it has no 2_Dense/. What this project cannot compute exactly (another
    activation, no bias) is refused by name rather than served differently from sentence-transformers."""
    model_dir = Path(model_dir)
    if not (model_dir / DENSE_CONFIG).is_file():
        return None
    config = json.loads((model_dir / DENSE_CONFIG).read_text())
    if config.get("activation_function", IDENTITY) != IDENTITY or not config.get("bias", True):
        raise ValueError(
            f"{model_dir / DENSE_CONFIG}: only a Dense with bias and activation {IDENTITY} is supported, "
            f"got bias={config.get('bias')}, activation_function={config.get('activation_function')}"
        )
    tensors = load_file(str(model_dir / DENSE_WEIGHTS))
    dense = Dense(tensors[DENSE_WEIGHT_KEY], tensors[DENSE_BIAS_KEY])
    if (dense.in_features, dense.out_features) != (config["in_features"], config["out_features"]):
        raise ValueError(
            f"{model_dir / DENSE_DIR}: config.json says {config['in_features']} → {config['out_features']}, "
            f"the weights are {dense.in_features} → {dense.out_features}"
        )
    return dense


def embedding_size(config: dict, dense: Dense | None) -> int:
    """The width of the dir's embedding: the Dense's output, else the hidden size."""
    return config["hidden_size"] if dense is None else dense.out_features


def sentence_transformers_files(config: dict, dense: Dense | None = None) -> dict[str, dict | list]:
    """{relative path: JSON content} of the sentence-transformers layout. Normalize has no settings,
    so its "2_Normalize" path ("3_Normalize" after a Dense) needs no dir (sentence-transformers' own
    save leaves it empty). A Dense's weights are written by `write_dense`; its config.json is here.

    Written in the layout sentence-transformers has read since 2.x (`models.*` class paths, the four
    original `pooling_mode_*` flags, later modes off by default); the current release maps both to its
    own names on load. `trust_remote_code` needs 2.3 or later.
    """
    modules = [("", "Transformer"), ("1_Pooling", "Pooling")]
    if dense is not None and dense.in_features != config["hidden_size"]:
        raise ValueError(
            f"{DENSE_DIR} maps {dense.in_features} features; the model's hidden size is {config['hidden_size']}"
        )
    if dense is None:
        modules.append(("2_Normalize", "Normalize"))
    else:
        modules += [(DENSE_DIR, "Dense"), ("3_Normalize", "Normalize")]
    files = {
        "modules.json": [
            {"idx": i, "name": str(i), "path": path, "type": f"sentence_transformers.models.{kind}"}
            for i, (path, kind) in enumerate(modules)
        ],
        "sentence_bert_config.json": {
            "max_seq_length": config["max_position_embeddings"],
            "do_lower_case": False,  # the tokenizer lower-cases (BERT uncased)
        },
        "1_Pooling/config.json": {
            "word_embedding_dimension": config["hidden_size"],
            "pooling_mode_cls_token": False,
            "pooling_mode_mean_tokens": True,  # over attention_mask = 1, i.e. real tokens only
            "pooling_mode_max_tokens": False,
            "pooling_mode_mean_sqrt_len_tokens": False,
        },
    }
    if dense is not None:
        files[DENSE_CONFIG] = dense.config()
    return files


def write_sentence_transformers_files(out_dir: str | Path) -> list[str]:
    out_dir = Path(out_dir)
    config = json.loads((out_dir / CONFIG).read_text())
    files = sentence_transformers_files(config, read_dense(out_dir))
    for rel, content in files.items():
        write_json(out_dir / rel, content)
    return list(files)


# -- the model card ----------------------------------------------------------------------------------

# held-out metric suffix in training_card.json → metric id on the Hub
HUB_METRICS = {
    "accuracy": "accuracy",
    "f1_macro": "f1",
    "mcc": "matthews_correlation",
    "exact_match": "exact_match",
    "f1": "f1",
    "entity_f1": "f1",
}


def hub_datasets(card: dict) -> list[str]:
    """Hugging Face dataset ids among the training sources ("hf:name[:config]" specs); the project's
    registry sources are not on the Hub and are named in the card's text instead."""
    data = card.get("config", {}).get("data", {})
    specs = list(data.get("sources") or []) + [card.get("data", {}).get("config", {}).get("source")]
    return sorted({s[3:].partition(":")[0] for s in specs if isinstance(s, str) and s.startswith("hf:")})


def hub_metrics(held_out: dict) -> list[str]:
    names = {key.split("_", 1)[1] for key in held_out if "_" in key}
    return sorted({HUB_METRICS[n] for n in names if n in HUB_METRICS})


def card_metadata(config: dict, card: dict | None) -> ModelCardData:
    architecture = (config.get("architectures") or ["BiGSModel"])[0]
    trained = card is not None and card.get("stage") != "init"
    tags = ["bigs", "state-space-model", "attention-free", "custom_code", "sentence-transformers"]
    embedding_model = architecture == EMBEDDING_ARCHITECTURE
    if embedding_model:
        tags.append("feature-extraction")
    if card is not None and not trained:
        tags.append("untrained")
    return ModelCardData(
        license=LICENSE,
        library_name="sentence-transformers" if embedding_model else "transformers",
        pipeline_tag=PIPELINE_TAGS.get(architecture, "feature-extraction"),
        tags=tags,
        datasets=(hub_datasets(card) or None) if trained else None,
        metrics=(hub_metrics(card.get("held_out", {})) or None) if trained else None,
        language=["en"],
    )


def describe_layers(config: dict, architecture: str) -> str:
    """One sentence on the row of the family the config picks (docs/DESIGN.md §2.7, §2.8)."""
    block = config.get("block_type", "gated")
    routing = config.get("routing") or ("spatial" if block == "gmlp" else "ssm")
    head = (
        " Its MLM head is CLAP's: the tied token embeddings L2-normalised, scaled by a learned inverse temperature."
        if config.get("mlm_head") == "clap"
        else ""
    )
    if (block, routing) == ("gated", "ssm"):
        return (
            f"A BiGS encoder (`{architecture}`): bidirectional gated state-space layers and no attention "
            f'("Pretraining Without Attention", Wang et al.).{head}'
        )
    if block == "gmlp":
        return (
            f"An encoder of the BiGS family (`{architecture}`, block_type=gmlp): gMLP blocks, whose spatial gating "
            f"unit mixes positions through a learned {config.get('max_position_embeddings')} × "
            f'{config.get("max_position_embeddings")} matrix ("Pay Attention to MLPs", Liu et al.): it reads at '
            f"most that many tokens.{head}"
        )
    layers = {
        ("gated", "attention"): "gated layers with bidirectional multi-head self-attention in place of the SSMs",
        ("stack", "ssm"): "stacked layers (BERT's layout) with a bidirectional SSM pair in place of attention",
        ("stack", "attention"): "stacked layers with bidirectional multi-head self-attention, i.e. BERT",
    }.get((block, routing))
    if layers is not None:  # the rows of the paper's Table 1
        return (
            f"An encoder of the BiGS family (`{architecture}`, block_type={block}, routing={routing}): {layers}, "
            f'one row of the controlled comparison of "Pretraining Without Attention" (Wang et al.).{head}'
        )
    mixers = {
        "alibi": "bidirectional multi-head self-attention with ALiBi's linear distance biases and no position "
        "embeddings",
        "synthesizer-random": "a random Synthesizer (a learned alignment per head over a fixed number of positions)",
        "synthesizer-dense": "a dense Synthesizer (each token's alignment predicted by a two-layer MLP)",
    }
    layout = "gated layers" if block == "gated" else "stacked layers (BERT's layout)"
    return (
        f"An encoder of the BiGS family (`{architecture}`, block_type={block}, routing={routing}): {layout} with "
        f"{mixers[routing]}, one of the encoders compared with BiGS.{head}"
    )


def model_card(
    name: str,
    config: dict,
    card: dict | None,
    notes: list[str] = (),
    dense: Dense | None = None,
    evaluation: dict | None = None,
    limitations: str | None = None,
    served: dict | None = None,
    refused: dict[str, str] | None = None,
    int8_floor: str | None = None,
) -> str:
    """README.md text: YAML front matter (huggingface_hub's ModelCardData) and what the dir knows.
    `served`: eval-served.json, the export's figures at the precision it is served at; `refused`: the reduced
    precisions the dir refuses (refused_precisions.json), each with why; `int8_floor`: why int8 leaves more in
    fp32 than its gate asks (int8_floor.json)."""
    architecture = (config.get("architectures") or ["BiGSModel"])[0]
    meta = card_metadata(config, card)
    d, layers = config.get("hidden_size"), config.get("num_hidden_layers")
    lines = [
        "---",
        meta.to_yaml(),
        "---",
        GENERATED,
        "",
        f"# {name}",
        "",
        f"{describe_layers(config, architecture)} "
        f"d = {d}, {layers} layers, I = {config.get('intermediate_size')}, N = {config.get('num_ssm')} SSM modes, "
        f"inputs up to {config.get('max_position_embeddings')} tokens, BERT uncased WordPiece "
        f"({config.get('vocab_size')} entries).",
        "",
    ]
    if card is None:
        lines += [
            "This dir has no training_card.json: what these weights were trained on is not recorded here.",
            "",
        ]
    elif card.get("stage") == "init":
        lines += [
            f"**These weights are untrained**: a random initialization written by `bigs init` (seed "
            f"{card.get('seed')}). Its outputs are meaningless; the dir is for testing the path from "
            "weights to an answer.",
            "",
        ]
    else:
        lines += training_section(card)
    if config.get("id2label"):
        labels = ", ".join(str(v) for _, v in sorted(config["id2label"].items(), key=lambda kv: int(kv[0])))
        lines += [f"Labels: {labels}.", ""]
    lines += evaluation_lines(evaluation)
    lines += served_lines(evaluation, served, refused, int8_floor)
    if limitations:
        lines += ["## Limitations", "", limitations.strip(), ""]
    lines += usage_section(architecture, dense)
    lines += [*notes, ""] if notes else []
    lines += [
        "## License",
        "",
        "Apache-2.0, the license of the code that defines and trained the model. The training sources "
        "listed above carry their own licenses.",
        "",
    ]
    return "\n".join(lines)


def training_section(card: dict) -> list[str]:
    lines = ["## Training", ""]
    facts = [
        ("stage", card.get("stage")),
        ("steps", card.get("steps")),
        ("tokens seen", card.get("tokens_seen")),
        ("training wall time (s)", _round(card.get("train_wall_time_s"))),
        ("device", (card.get("device") or {}).get("device_kind")),
        ("machine", ", ".join(sorted({(s.get("machine") or {}).get("cpu", "") for s in card.get("slices") or []} - {""}))
         or None),
        ("slices", len(card.get("slices") or []) or None),
        ("extended from", (card.get("extended_from") or {}).get("artifact")),
        ("fine-tuned from", card.get("fine_tuned_from")),
    ]  # fmt: skip
    lines += [f"- {k}: {v}" for k, v in facts if v is not None]
    lines.append("")
    lines += distillation_lines(card.get("distill"), card.get("stage"))
    data = card.get("data") or {}
    sources = data.get("sources") or ({data["source"]["name"]: data["source"]} if data.get("source") else {})
    if sources:
        lines += ["Data (training_card.json `data` has the splits, seed and tokenizer hash):", ""]
        lines += ["| source | what | package |", "|---|---|---|"]
        for source_name, s in sources.items():
            package = s.get("package") or ""
            version = s.get("version")
            if version and not package.endswith(str(version)):
                package = f"{package} ({version})"
            lines.append(f"| {source_name} | {s.get('description', '')} | {package} |")
        lines.append("")
    held_out = card.get("held_out") or {}
    if held_out:
        lines += ["Held-out results:", "", "| split | metric | value |", "|---|---|---|"]
        # an MLM's loss and accuracy are over the masked tokens
        names = (
            {"loss": "MLM loss", "accuracy": "masked-token accuracy"} if card.get("stage") in ("mlm", "extend") else {}
        )
        for key, value in held_out.items():
            split, _, metric = key.partition("_")
            split, metric = {"eval": "validation"}.get(split, split), names.get(metric, metric)
            lines.append(f"| {split} | {metric} | {_round(value, 4)} |")
        baseline = card.get("majority_baseline_test")
        if baseline:
            lines += ["", f"Majority-class baseline on test: accuracy {_round(baseline.get('accuracy'), 4)}."]
        lines.append("")
    return lines


def distillation_lines(distill: dict | None, stage: str | None = None) -> list[str]:
    """What a distilled run took from its teacher (training/distill.py), from the card's `distill`.
    An embedding model (`stage` "embed") and its teacher read the same text; an MLM read it masked."""
    if not distill:
        return []
    settings = distill.get("settings") or {}
    name = distill.get("teacher_name") or distill.get("teacher")
    reading = (
        "both reading the same unmasked text, with no MLM loss"
        if stage == "embed"
        else "which read the unmasked text while this model read the masked one"
    )
    lines = [
        f"Distilled from **{name}** (licence: {distill.get('teacher_licence') or 'see its model card'}), {reading}:",
        "",
        f"- hidden states: weight {settings.get('hidden_weight')}, {settings.get('hidden_kind')}, "
        f"(student, teacher) layer pairs {distill.get('layer_pairs')}",
        f"- sentence embedding: weight {settings.get('embedding_weight')}",
    ]
    logits_teacher = distill.get("logits_teacher")
    if logits_teacher and (settings.get("logits_weight") or 0) > 0:
        where = "whose token is its first answer" if settings.get("logits_where") == "teacher_right" else "all"
        lines.append(
            f"- the answers of a teacher masked LM ({logits_teacher.get('path')}, reading the masked text): "
            f"T² · KL at the masked positions ({where}), weight {settings.get('logits_weight')}, "
            f"T = {settings.get('temperature')}"
        )
    init = distill.get("init_from_teacher")
    if init:
        fraction = (init.get("pca") or {}).get("explained_variance_fraction")
        kept = (
            f", {fraction:.1%} of their variance kept"
            if isinstance(fraction, float) and init.get("word_embeddings") == "pca"
            else ""
        )
        lines.append(f"- initialised from the teacher: word embeddings {init.get('word_embeddings')}{kept}; "
                     f"positions {init.get('position_embeddings')}")  # fmt: skip
    return [*lines, ""]


def evaluation_lines(report: dict | None) -> list[str]:
    """`bigs eval --json`'s report (eval.json beside the weights) as a table."""
    if not report:
        return []
    lines = ["## Held-out evaluation", "", "`bigs eval` on this dir (training/evaluation.py):", ""]
    lines += ["| set | metric | value | n | note |", "|---|---|---|---|---|"]
    for row in report.get("rows", []):
        lines.append(
            f"| {row['set']} | {row['metric']} | {row['value']:.4f} | {row['count']} | {row.get('note', '')} |"
        )
    examples = report.get("examples") or []
    if examples:
        lines += ["", "Some cloze answers (top 5):", ""]
        lines += [f"- `{e['text']}` → {', '.join(e['top5'])}" for e in examples]
    return [*lines, ""]


def served_lines(
    report: dict | None, served: dict | None, refused: dict[str, str] | None = None, int8_floor: str | None = None
) -> list[str]:
    """The figures of the model as served at reduced precision (eval-served.json) beside eval.json's, row by
    row (same set, metric and note): what the speed-up costs in accuracy. Baselines are left out. Then each
    precision the dir refuses (`refused`: precision → why), which export writes no variant of, and the int8
    floor (`int8_floor`: why int8 leaves the products it names in fp32)."""
    if not report or not served:
        return []
    fp32 = {(r["set"], r["metric"], r.get("note", "")): r["value"] for r in report.get("rows", [])}
    lines = ["## Served at reduced precision", "", f"`bigs eval` on the export at precision {served.get('precision')} "
             "(what `bigs serve` answers with there), beside the table above:", "",
             "| set | metric | fp32 | served | difference | n |", "|---|---|---|---|---|---|"]  # fmt: skip
    for row in served.get("rows", []):
        key = (row["set"], row["metric"], row.get("note", ""))
        if row.get("note") == "baseline" or "teacher" in row.get("note", "") or key not in fp32:
            continue
        change = 100 * (row["value"] - fp32[key])
        metric = f"{row['metric']} ({row['note']})" if row.get("note") else row["metric"]
        lines.append(f"| {row['set']} | {metric} | {fp32[key]:.4f} | {row['value']:.4f} | "
                     f"{change:+.2f} points | {row['count']} |")  # fmt: skip
    for precision, why in (refused or {}).items():
        lines += ["", f"Not served at {precision}: this dir refuses it (refused_precisions.json; export writes no "
                  f"{precision} variant by default): {why}."]  # fmt: skip
    if int8_floor:
        lines += ["", f"int8 leaves more of its products in fp32 than its accuracy gate asks: {int8_floor}."]
    return [*lines, ""]


def usage_section(architecture: str, dense: Dense | None = None) -> list[str]:
    task = PIPELINE_TAGS.get(architecture)
    embedding = "mean over real tokens, L2-normalised"
    if dense is not None:
        embedding = f"mean over real tokens, {DENSE_DIR} ({dense.in_features} → {dense.out_features}), L2-normalised"
    example = {
        "fill-mask": 'print(pipe("The capital of France is [MASK]."))',
        "text-classification": 'print(pipe("A long document ..."))',
        "question-answering": 'print(pipe(question="Who wrote it?", context="A long document ..."))',
        "token-classification": 'print(pipe("A sentence with names in it.", aggregation_strategy="simple"))',
    }
    lines = [
        "## Use",
        "",
        "The model code is in this dir (configuration_bigs.py, modeling_bigs.py, …), so plain "
        "transformers loads it with `trust_remote_code=True`; nothing else to install.",
        "",
        "```python",
    ]
    if architecture == EMBEDDING_ARCHITECTURE:  # no transformers pipeline for it: the encoder's hidden states
        lines += [
            "from transformers import AutoModel, AutoTokenizer",
            "",
            'tokenizer = AutoTokenizer.from_pretrained("path/to/this/dir")',
            'encoder = AutoModel.from_pretrained("path/to/this/dir", trust_remote_code=True)',
            'hidden = encoder(**tokenizer(["a sentence"], return_tensors="pt")).last_hidden_state  # (1, L, d)',
            "",
        ]
    elif task:
        lines += [
            "from transformers import pipeline",
            "",
            f'pipe = pipeline("{task}", model="path/to/this/dir", trust_remote_code=True)',
            example[task],
            "",
        ]
    lines += [
        "from sentence_transformers import SentenceTransformer",
        "",
        'embedder = SentenceTransformer("path/to/this/dir", trust_remote_code=True)',
        f'vectors = embedder.encode(["a sentence", "another one"])  # {embedding}',
        "```",
        "",
        "Served over HTTP: `bigs export DIR OUT_DIR`, then `bigs serve --model NAME=OUT_DIR`.",
        "",
    ]
    return lines


def _round(value, digits: int = 1):
    return round(value, digits) if isinstance(value, float) else value
