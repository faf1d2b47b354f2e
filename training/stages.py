"""The paper's three stages, each: data → model → trainer → artifact dir.

mlm       masked-LM pretraining from scratch at a short length (128)
extend    continued MLM pretraining at a longer length (512 … 4096) from a shorter artifact:
          position embeddings grow by tiling the learned ones (the Longformer protocol the
          paper follows), so the model behaves exactly as before on short inputs at step 0
embed     a dedicated embedding model (BiGSModel + its 2_Dense) from an artifact: a teacher's
          sentence embedding (and hidden states) on the unmasked text, no MLM; positions grow as
          in extend, so it can be trained at 128 and then at 512 for 4,096-token inputs
classify  fine-tuning a sequence classifier from an MLM artifact (single texts or pairs,
          documents up to 4,096 tokens)
qa        fine-tuning extractive question answering (start/end of the answer span) from an MLM
          artifact on SQuAD-format JSON (v1.1, or v2.0 with unanswerable questions)
tokens    fine-tuning token classification (named entities, tags) from an MLM artifact on CoNLL
          or JSONL files
"""

from __future__ import annotations

import time
from pathlib import Path

import jax
import numpy as np

from model.configuration_bigs import BiGSConfig
from model.hub import Dense, read_dense
from model.modeling_flax_bigs import (
    FlaxBiGSEncoderModelModule,
    FlaxBiGSForMaskedLMModule,
    FlaxBiGSForQuestionAnsweringModule,
    FlaxBiGSForSequenceClassificationModule,
    FlaxBiGSForTokenClassificationModule,
    init_params,
)
from model.positions import extend_positions  # the one tiling of positions (model/positions.py)
from model.tokenizer import bert_uncased_tokenizer
from training.data import BatchOrder, MaskingConfig, build_corpus, build_labelled, mask_tokens, open_split, repack
from training.data.spans import encode_qa, encode_tagged, label_names, read_squad, read_tagged, split_by
from training.data.tokenization import cut_rows

from .artifact import device_description, load_artifact, write_artifact
from .config import TrainConfig
from .distill import PROJECTIONS_KEY, DistilledEmbedding, DistilledMLM, student_params
from .metrics import classification_report, entity_f1, majority_baseline, squad_scores
from .precision import compute_precision
from .slices import weights_dir
from .steps import classification_loss_sums, mlm_loss_sums
from .teacher import Teacher, default_teacher_dir, fit_pca, init_from_teacher
from .trainer import Trainer, TrainTask, maybe_initialize_distributed, plot_curves

# ------------------------------------------------------------------------------------------
# Parameters
# ------------------------------------------------------------------------------------------


def restrict_to(params: dict, template: dict) -> dict:
    """Keep only the branches the module has (an MLM tree from torch carries an unused pooler)."""
    return {k: restrict_to(params[k], v) if isinstance(v, dict) else params[k] for k, v in template.items()}


def backbone_from(source: dict, fresh: dict) -> dict:
    """A classifier's params: the MLM backbone where it has one, fresh init for pooler/classifier."""
    merged = jax.tree_util.tree_map(np.asarray, fresh)
    for key, value in source["s4_bert"].items():
        merged["s4_bert"][key] = jax.tree_util.tree_map(np.asarray, value)
    return merged


# ------------------------------------------------------------------------------------------
# Data → batch sources
# ------------------------------------------------------------------------------------------
# Every source reads rows through a BatchOrder: training asks for the batch of step s (so a
# resumed run gets exactly the batches it would have had), evaluation reads one ordered pass.


def max_predictions(seq_len: int, mask_prob: float) -> int:
    """Room for every masked position of a full sequence (rounded up to a multiple of 8)."""
    return -(-int(np.ceil(seq_len * mask_prob + 1)) // 8) * 8


def masked_batch(
    ids: np.ndarray, masking: MaskingConfig, seed: int, step: int, unmasked: bool = False
) -> dict[str, np.ndarray]:
    """An MLM batch that asks for logits only at the masked positions (B, P); with `unmasked`, also
    the text before masking (what a distillation teacher reads)."""
    predictions = max_predictions(ids.shape[1], masking.mlm_probability)
    masked = mask_tokens(ids, masking, seed, step, max_predictions=predictions)
    batch = {
        "input_ids": masked["input_ids"],
        "attention_mask": (ids != masking.pad_id).astype(np.int32),
        "token_type_ids": np.zeros_like(masked["input_ids"]),
        "logits_positions": masked["mlm_positions"],
        "labels": masked["mlm_ids"],  # −100 where a row has fewer than P masked tokens
    }
    if unmasked:
        batch["unmasked_input_ids"] = ids
    return batch


def packed_batch_source(split, batch_size: int, seed: int, make_batch):
    """The training batch of each step from packed rows: `make_batch(ids (B, L) int32, seed, step)`
    turns the step's rows into a batch (masked for an MLM, cut for an embedding model)."""
    order = BatchOrder(len(split), batch_size, seed)

    def batch_at(step: int) -> dict[str, np.ndarray]:
        _, rows = order.indices(step)
        return make_batch(split[rows].astype(np.int32), seed, step)  # stored as uint16

    return batch_at


def packed_eval_batches(split, batch_size: int, seed: int, max_batches: int, make_batch):
    """The same held-out batches at every evaluation: fixed rows, and `make_batch` given a fixed seed."""
    order = BatchOrder.one_pass(min(len(split), batch_size * max_batches), batch_size)
    held_out_seed = seed + 7919

    def batches():
        for step in range(order.steps_per_epoch):
            _, rows = order.indices(step)
            yield make_batch(split[rows].astype(np.int32), held_out_seed, step)

    return batches


def mlm_batch_source(split, batch_size: int, masking: MaskingConfig, seed: int, unmasked: bool = False):
    return packed_batch_source(
        split, batch_size, seed, lambda ids, seed, step: masked_batch(ids, masking, seed, step, unmasked)
    )


def mlm_eval_batches(
    split, batch_size: int, masking: MaskingConfig, seed: int, max_batches: int, unmasked: bool = False
):
    """The same masked held-out batches at every evaluation (fixed rows, fixed masks)."""
    return packed_eval_batches(
        split, batch_size, seed, max_batches, lambda ids, seed, step: masked_batch(ids, masking, seed, step, unmasked)
    )


# An embedding model's rows: the shortest crop kept when a row has no document end to cut at.
MIN_CROP_TOKENS = 8


def embedding_batch(ids: np.ndarray, pad_id: int, sep_id: int, crop_fraction: float, seed: int, step: int):
    """An embedding model's batch of packed rows, unmasked (student and teacher read the same text).
    A share `crop_fraction` of the rows is cut short, so short texts are learned as well as full rows:
    at the end of the row's first document where the row holds a document end ([CLS] doc [SEP], a
    sentence where the corpus has sentences), else at a random length ≥ MIN_CROP_TOKENS, closed by
    [SEP]. Which rows and where depend on (seed, step) only: a resumed run cuts the same. `labels` (B,)
    count the rows (the loss is per row)."""
    ids = ids.copy()
    rng = np.random.default_rng((seed, step))
    for r in np.flatnonzero(rng.random(len(ids)) < crop_fraction):
        row = ids[r]  # a view: the cut is made in `ids`
        real = int(np.sum(row != pad_id))
        inner_ends = np.flatnonzero(row[1 : real - 1] == sep_id) + 1
        if len(inner_ends):
            end = int(inner_ends[0]) + 1
        else:
            end = int(rng.integers(min(MIN_CROP_TOKENS, real), real + 1))
            row[end - 1] = sep_id
        row[end:] = pad_id
    return {
        "input_ids": ids,
        "attention_mask": (ids != pad_id).astype(np.int32),
        "token_type_ids": np.zeros_like(ids),
        "labels": np.ones(len(ids), np.int32),
    }


def labelled_batch_source(split, batch_size: int, seed: int):
    order = BatchOrder(len(split), batch_size, seed)

    def batch_at(step: int) -> dict[str, np.ndarray]:
        _, rows = order.indices(step)
        arrays = split.take(rows)
        return {k: arrays[k] for k in ("input_ids", "attention_mask", "token_type_ids", "labels")}

    return batch_at


def labelled_eval_batches(split, batch_size: int):
    order = BatchOrder.one_pass(len(split), batch_size)

    def batches():
        for step in range(order.steps_per_epoch):
            _, rows = order.indices(step)
            arrays = split.take(rows)
            yield {k: arrays[k] for k in ("input_ids", "attention_mask", "token_type_ids", "labels")}

    return batches


def truncated_batches(batches, length: int, sep_id: int):
    """The same batches with every sequence cut to `length` tokens as the tokenizer cuts a single
    text (truncation=True): [CLS] + the first length − 2 tokens + [SEP]. What a model limited to
    `length` sees of each document, so a long-input classifier can be scored against itself cut short."""

    def cut():
        for batch in batches():
            yield cut_rows(batch, length, sep_id)

    return cut


# ------------------------------------------------------------------------------------------
# Stages
# ------------------------------------------------------------------------------------------


def run(config: TrainConfig) -> Path:
    maybe_initialize_distributed()
    started = time.time()
    if config.stage == "classify":
        return _classify(config, started)
    if config.stage == "qa":
        return _question_answering(config, started)
    if config.stage == "tokens":
        return _token_classification(config, started)
    if config.stage == "embed":
        return _embedding_model(config, started)
    return _masked_lm(config, started)


def _model_config(config: TrainConfig, vocab_size: int) -> BiGSConfig:
    m = config.model
    return BiGSConfig(
        vocab_size=vocab_size,
        hidden_size=m.hidden_size,
        num_hidden_layers=m.num_hidden_layers,
        intermediate_size=m.intermediate_size or 3 * m.hidden_size,
        num_ssm=m.num_ssm,
        max_position_embeddings=max(m.max_position_embeddings, config.data.seq_len),
        hidden_dropout_prob=m.hidden_dropout_prob,
        block_type=m.block_type,
        routing=m.routing,
        num_attention_heads=m.num_attention_heads,
        mlm_head=m.mlm_head,
    )


def _source_with_positions(config: TrainConfig) -> tuple[BiGSConfig, dict, int]:
    """(config, params, its old position count) of `init_from`, its positions grown to the longest of:
    the source, the training length, and model.max_position_embeddings (train at 512, serve up to 4,096
    from the same tiling); `model.tile_positions_from` tiles the first N rows instead."""
    model_config, source_params = load_artifact(config.init_from)
    old_length = model_config.max_position_embeddings
    new_length = max(old_length, config.data.seq_len, config.model.max_position_embeddings)
    if model_config.fixed_length is not None and new_length != old_length:
        raise ValueError(
            f"{config.init_from} (block_type={model_config.block_type}, routing={model_config.routing}) is tied to "
            f"its {old_length} positions by a learned {old_length} × {old_length} matrix: it cannot be extended to "
            f"{new_length} (train a new model at that length)"
        )
    model_config.max_position_embeddings = new_length
    params = extend_positions(source_params, model_config.max_position_embeddings, config.model.tile_positions_from)
    return model_config, params, old_length


def _corpus_splits(config: TrainConfig, tokenizer):
    """The unlabelled corpus packed at data.seq_len (built once per data dir): (card, train, validation)."""
    seq_len = config.data.seq_len
    data_dir = Path(config.data.data_dir or Path(config.output_dir) / "data")
    data_card = build_corpus(
        config.data.sources, data_dir, seq_len=seq_len, max_docs=config.data.max_docs, seed=config.seed,
        cache_dir=config.data.cache_dir, tokenizer=tokenizer, train_repeats=config.data.repeat,
    )  # fmt: skip
    if str(seq_len) not in data_card["packed"]:
        data_card = repack(data_dir, seq_len, tokenizer)
    return data_card, open_split(data_dir, "train", seq_len), open_split(data_dir, "validation", seq_len)


def _extended_from(config: TrainConfig, old_length: int) -> dict:
    """What the card records of the artifact a stage continued from."""
    record = {"artifact": str(config.init_from), "max_position_embeddings": old_length}
    if config.model.tile_positions_from:
        record["positions_tiled_from"] = config.model.tile_positions_from
    return record


def teacher_dir_of(name: str) -> Path:
    """A teacher named in a config: 'default' (all-MiniLM-L6-v2, the distill extra) or a local dir."""
    return default_teacher_dir() if name == "default" else Path(name)


def _teacher_as_mlm(config: TrainConfig) -> tuple[BiGSConfig, dict, dict]:
    """teacher-mlm's start: `init_from`, a BERT-family encoder, as the stack/attention post-norm row
    (model/bert.py) with its encoder's weights and a BERT MLM head: the teacher's own when it has one
    (going on from an adapted teacher), else fresh (BERT's init; the decoder tied to its word
    embeddings). Returns (config, params or the encoder alone to merge into a fresh tree, the source's
    BERT config, which the artifact is written with)."""
    teacher = Teacher.from_dir(teacher_dir_of(config.init_from))  # refuses another vocabulary by name
    if config.data.seq_len > int(teacher.config["max_position_embeddings"]):
        raise ValueError(f"data.seq_len {config.data.seq_len} is past the teacher's positions")
    model_config = teacher.bigs_config()
    model_config.hidden_dropout_prob = config.model.hidden_dropout_prob
    params = teacher.mlm_flax_params if teacher.has_mlm_head else {"s4_bert": teacher.flax_params}
    return model_config, params, teacher.config


def _masked_lm(config: TrainConfig, started: float) -> Path:
    seq_len = config.data.seq_len
    bert_base = None
    if config.stage == "extend":
        model_config, start_params, old_length = _source_with_positions(config)
    elif config.stage == "teacher-mlm":
        model_config, start_params, bert_base = _teacher_as_mlm(config)
        old_length = None
    else:
        model_config, start_params, old_length = None, None, None
    tokenizer = bert_uncased_tokenizer(model_max_length=max(seq_len, 512))
    data_card, train_split, eval_split = _corpus_splits(config, tokenizer)
    if model_config is None:
        model_config = _model_config(config, len(tokenizer))
    module_kwargs = compute_precision(config.dtype).module_kwargs()
    module = FlaxBiGSForMaskedLMModule(model_config, **module_kwargs)
    fresh = init_params(module, seed=config.seed)
    if config.stage == "teacher-mlm":  # the teacher's encoder (and MLM head, where it has one); the rest fresh
        params = {**fresh, **jax.tree_util.tree_map(np.asarray, start_params)}
        params = restrict_to(params, fresh)
    else:
        params = fresh if start_params is None else restrict_to(start_params, fresh)
    masking = MaskingConfig.from_tokenizer(tokenizer, mlm_probability=config.data.mask_prob)
    stage_card = _stage_card(config, data_card)
    if config.stage == "extend":
        stage_card["extended_from"] = _extended_from(config, old_length)
    if config.stage == "teacher-mlm":
        stage_card["adapted_from"] = {
            "teacher": str(teacher_dir_of(config.init_from)),
            "mlm_head": "the teacher's" if "cls" in start_params else "fresh (BERT init, decoder tied)",
        }
    apply_fn, loss_sums, not_in_weights = module.apply, mlm_loss_sums, ()
    # an adapted teacher is written as the BERT dir it came from: plain transformers loads it
    architecture = "BertForMaskedLM" if bert_base is not None else "BiGSForMaskedLM"
    distilling = config.distill is not None
    with_dense = distilling and config.distill.embedding_weight > 0  # the embedding it fitted is served
    if distilling:
        # An extension goes on with the sentence projection its source was served with (its 2_Dense):
        # a fresh one would pull the backbone toward an unfitted map in the extension's few steps.
        sentence_from = read_dense(config.init_from) if config.stage == "extend" else None
        objective, params, stage_card["distill"] = _distillation(
            config, module, params, module_kwargs, fresh=start_params is None, sentence_from=sentence_from
        )
        apply_fn, loss_sums, not_in_weights = objective.apply_fn, objective.loss_sums, (PROJECTIONS_KEY,)
    eval_batches = mlm_eval_batches(
        eval_split, config.batch_size, masking, config.seed, config.eval_batches, unmasked=distilling
    )
    task = TrainTask(
        apply_fn=apply_fn,
        params=params,
        loss_sums=loss_sums,
        train_batch=mlm_batch_source(train_split, config.batch_size, masking, config.seed, unmasked=distilling),
        eval_batches=eval_batches,
        write_weights=_weights_writer(model_config, architecture, tokenizer, stage_card, with_dense, bert_base),
        not_in_weights=not_in_weights,
    )
    trainer = Trainer(config, task, clock_started=started)
    held_out = trainer.fit()
    if trainer.stopped:
        return _stopped(config, trainer)
    card = _card(stage_card, trainer, held_out, started)
    return _finish(config, trainer, model_config, architecture, card, tokenizer, with_dense, bert_base)


def _embedding_model(config: TrainConfig, started: float) -> Path:
    """A dedicated embedding model: `init_from`'s backbone (an MLM's, or an embedding model's to go on
    at another length) as BiGSModel, trained on the teacher's losses alone over the unlabelled corpus,
    its sentence projection starting from the source's 2_Dense and written as the artifact's."""
    seq_len = config.data.seq_len
    model_config, source_params, old_length = _source_with_positions(config)
    tokenizer = bert_uncased_tokenizer(model_max_length=max(seq_len, 512))
    data_card, train_split, eval_split = _corpus_splits(config, tokenizer)
    module_kwargs = compute_precision(config.dtype).module_kwargs()
    module = FlaxBiGSEncoderModelModule(model_config, **module_kwargs)
    params = backbone_from(source_params, init_params(module, seed=config.seed))
    stage_card = _stage_card(config, data_card)
    stage_card["extended_from"] = _extended_from(config, old_length)
    objective, params, stage_card["distill"] = _distillation(
        config, module, params, module_kwargs, fresh=False, sentence_from=read_dense(config.init_from),
        objective=DistilledEmbedding,
    )  # fmt: skip
    pad_id, sep_id, crop = tokenizer.pad_token_id, tokenizer.sep_token_id, config.data.crop_fraction
    cut = lambda ids, seed, step: embedding_batch(ids, pad_id, sep_id, crop, seed, step)  # noqa: E731
    task = TrainTask(
        apply_fn=objective.apply_fn,
        params=params,
        loss_sums=objective.loss_sums,
        train_batch=packed_batch_source(train_split, config.batch_size, config.seed, cut),
        eval_batches=packed_eval_batches(eval_split, config.batch_size, config.seed, config.eval_batches, cut),
        write_weights=_weights_writer(model_config, "BiGSModel", tokenizer, stage_card, with_dense=True),
        not_in_weights=(PROJECTIONS_KEY,),
    )
    trainer = Trainer(config, task, clock_started=started)
    held_out = trainer.fit()
    if trainer.stopped:
        return _stopped(config, trainer)
    card = _card(stage_card, trainer, held_out, started)
    return _finish(config, trainer, model_config, "BiGSModel", card, tokenizer, with_dense=True)


def _distillation(
    config: TrainConfig, module, params: dict, module_kwargs: dict, fresh: bool, sentence_from: Dense | None = None,
    objective=DistilledMLM,
):  # fmt: skip
    """The teacher's objective (`objective`: DistilledMLM, or DistilledEmbedding), the params with its
    projections added (and, for a student trained from scratch, the teacher's embeddings), and what the
    card records of both. `sentence_from`: a Dense (d_s → d_t) the sentence projection starts from
    instead of a fresh one."""
    settings = config.distill
    teacher = Teacher.from_dir(teacher_dir_of(settings.teacher))
    teacher_positions = int(teacher.config["max_position_embeddings"])
    if config.data.seq_len > teacher_positions:
        raise ValueError(
            f"data.seq_len {config.data.seq_len} is past the teacher's {teacher_positions} positions: it cannot "
            "read those sequences (distil at its length, then extend without [distill])"
        )
    logits_teacher = None
    if settings.logits_weight > 0:
        logits_teacher = Teacher.from_dir(teacher_dir_of(settings.logits_teacher))
        if not logits_teacher.has_mlm_head:
            raise ValueError(
                f"logits_teacher {settings.logits_teacher} has no MLM head (cls.predictions.*): adapt it first "
                "with `bigs train teacher-mlm`"
            )
    objective = objective(module, teacher, settings, matmul_dtype=module_kwargs["matmul_dtype"], logits_teacher=logits_teacher)  # fmt: skip
    card = {
        "teacher": str(teacher.path),
        "teacher_name": teacher.name,
        "teacher_licence": teacher.licence,
        "teacher_config": {k: teacher.config.get(k) for k in ("hidden_size", "num_hidden_layers", "_name_or_path")},
        "settings": settings.model_dump(),
        "layer_pairs": [list(p) for p in objective.pairs],
    }
    if logits_teacher is not None:
        card["logits_teacher"] = {"path": str(logits_teacher.path), "card": _card_of(logits_teacher.path)}
    d_s, d_t = module.config.hidden_size, teacher.hidden_size
    kernel = None
    if d_s <= d_t:  # the projections start as the inverse of the embeddings' PCA map (its transpose)
        kernel = np.eye(d_t)[:, :d_s].T if d_s == d_t else fit_pca(teacher.word_embeddings, d_s)[1].T
    if fresh and settings.init_from_teacher:
        params, card["init_from_teacher"] = init_from_teacher(params, teacher, module.config)
    projections = objective.init_projections(config.seed, kernel)
    card["projections"] = "PCA axes transposed" if kernel is not None else "random"
    if sentence_from is not None and (sentence_from.in_features, sentence_from.out_features) == (d_s, d_t):
        projections["sentence"] = {
            "kernel": np.asarray(sentence_from.weight.T, np.float32),
            "bias": np.asarray(sentence_from.bias, np.float32),
        }
        card["sentence_projection"] = f"{config.init_from}: its 2_Dense"
    params = {**params, PROJECTIONS_KEY: projections}
    return objective, params, card


def _classify(config: TrainConfig, started: float) -> Path:
    out = Path(config.output_dir)
    data_dir = Path(config.data.data_dir or out / "data")
    model_config, source_params = load_artifact(config.init_from)
    max_length = min(config.data.seq_len, model_config.max_position_embeddings)
    tokenizer = bert_uncased_tokenizer(model_max_length=model_config.max_position_embeddings)
    options = {}
    if config.data.text_pair_column or config.data.label_column != "label" or config.data.text_column != "text":
        options = {"text_field": config.data.text_column, "label_field": config.data.label_column}
        if config.data.text_pair_column:
            options["text_pair_field"] = config.data.text_pair_column
    data_card = build_labelled(
        config.data.sources[0], data_dir, max_length=max_length, seed=config.seed, max_docs=config.data.max_docs,
        cache_dir=config.data.cache_dir, tokenizer=tokenizer, options=options,
    )  # fmt: skip
    id2label = {int(k): v for k, v in data_card["id2label"].items()}
    model_config.num_labels = len(id2label)
    model_config.id2label = id2label
    model_config.label2id = {v: k for k, v in id2label.items()}
    model_config.problem_type = "single_label_classification"
    model_config.hidden_dropout_prob = config.model.hidden_dropout_prob
    module = FlaxBiGSForSequenceClassificationModule(model_config, **compute_precision(config.dtype).module_kwargs())
    params = backbone_from(source_params, init_params(module, seed=config.seed))
    train_split, eval_split = open_split(data_dir, "train"), open_split(data_dir, "validation")
    num_labels = len(id2label)

    def eval_metrics(outputs: list[dict]) -> dict:
        labels = np.concatenate([o["labels"] for o in outputs])
        predictions = np.concatenate([o["predictions"] for o in outputs])
        report = classification_report(labels, predictions, num_labels)
        return {f"eval_{k}": v for k, v in report.items()}

    stage_card = {**_stage_card(config, data_card), "fine_tuned_from": str(config.init_from)}
    task = TrainTask(
        apply_fn=module.apply,
        params=params,
        loss_sums=classification_loss_sums,
        train_batch=labelled_batch_source(train_split, config.batch_size, config.seed),
        eval_batches=labelled_eval_batches(eval_split, config.batch_size),
        eval_metrics=eval_metrics,
        write_weights=_weights_writer(model_config, "BiGSForSequenceClassification", tokenizer, stage_card),
    )
    trainer = Trainer(config, task, clock_started=started)
    held_out = trainer.fit()
    if trainer.stopped:
        return _stopped(config, trainer)
    # The test split is scored once, at the end, next to the majority-class baseline.
    test_split = open_split(data_dir, "test")
    test_task_batches = labelled_eval_batches(test_split, config.batch_size)
    trainer.task = TrainTask(**{**task.__dict__, "eval_batches": test_task_batches})
    test = {k.replace("eval_", "test_"): v for k, v in trainer.evaluate(trainer.state.params).items()}
    for length in config.data.test_truncations:  # the same test documents, cut short
        trainer.task.eval_batches = truncated_batches(test_task_batches, length, test_split.special_ids.sep)
        cut = trainer.evaluate(trainer.state.params)
        test.update({k.replace("eval_", f"test_at_{length}_"): v for k, v in cut.items()})
    baseline = majority_baseline(
        np.asarray(train_split.arrays["labels"]), np.asarray(test_split.arrays["labels"]), num_labels
    )
    card = _card(stage_card, trainer, {**held_out, **test}, started)
    card["majority_baseline_test"] = baseline
    return _finish(config, trainer, model_config, "BiGSForSequenceClassification", card, tokenizer)


def _span_data(config: TrainConfig, read, group_key):
    """(train items, validation items, the data card) of a per-token stage: the one source, split by
    `group_key` unless a separate held-out file is given."""
    source = config.data.sources[0]
    items = read(source)
    if config.data.eval_source:
        train, held_out = items, read(config.data.eval_source)
    else:
        train_rows, eval_rows = split_by([group_key(x) for x in items], config.seed, config.data.validation_fraction)
        train, held_out = [items[i] for i in train_rows], [items[i] for i in eval_rows]
    card = {
        "kind": config.stage,
        "source": {"name": Path(source).name, "path": str(source)},
        "eval_source": str(config.data.eval_source) if config.data.eval_source else None,
        "splits": {"train": len(train), "validation": len(held_out)},
        "split_by": "file" if config.data.eval_source else "article" if config.stage == "qa" else "sentence",
        "seed": config.seed,
    }
    return train, held_out, card


def _fine_tuned_params(module, source_params: dict, seed: int) -> dict:
    """The source's backbone, a fresh head, and nothing the module does not have (an MLM's pooler)."""
    fresh = init_params(module, seed=seed)
    return restrict_to(backbone_from(source_params, fresh), fresh)


def _fine_tune(
    config: TrainConfig,
    started: float,
    model_config,
    module,
    source_params: dict,
    train_set,
    eval_set,
    data_card: dict,
    tokenizer,
    *,
    architecture: str,
    apply_fn,
    eval_metrics,
) -> Path:
    """A per-token head fine-tuned from `config.init_from`: its labelled batches, the classification
    loss (over every labelled position; -100 is not counted), then the artifact dir and its card."""
    stage_card = {**_stage_card(config, data_card), "fine_tuned_from": str(config.init_from)}
    task = TrainTask(
        apply_fn=apply_fn,
        params=_fine_tuned_params(module, source_params, config.seed),
        loss_sums=classification_loss_sums,
        train_batch=labelled_batch_source(train_set, config.batch_size, config.seed),
        eval_batches=labelled_eval_batches(eval_set, config.batch_size),
        eval_metrics=eval_metrics,
        write_weights=_weights_writer(model_config, architecture, tokenizer, stage_card),
    )
    trainer = Trainer(config, task, clock_started=started)
    held_out_metrics = trainer.fit()
    if trainer.stopped:
        return _stopped(config, trainer)
    card = _card(stage_card, trainer, held_out_metrics, started)
    return _finish(config, trainer, model_config, architecture, card, tokenizer)


def _question_answering(config: TrainConfig, started: float) -> Path:
    model_config, source_params = load_artifact(config.init_from)
    max_length = min(config.data.seq_len, model_config.max_position_embeddings)
    tokenizer = bert_uncased_tokenizer(model_max_length=model_config.max_position_embeddings)
    train, held_out, data_card = _span_data(config, read_squad, lambda e: e.article)
    train_set = encode_qa(train, tokenizer, max_length)
    eval_set = encode_qa(held_out, tokenizer, max_length)
    data_card["impossible"] = {
        "train": sum(e.is_impossible for e in train),
        "validation": sum(e.is_impossible for e in held_out),
    }
    model_config.hidden_dropout_prob = config.model.hidden_dropout_prob
    module = FlaxBiGSForQuestionAnsweringModule(model_config, **compute_precision(config.dtype).module_kwargs())

    def apply_fn(variables, *args, **kwargs):
        """(B, 2, L): start and end logits as two "classifications" over positions, so the loss is the
        mean of the two cross-entropies (Hugging Face's) and the labels are (B, 2) positions."""
        start, end = module.apply(variables, *args, **kwargs)
        return jax.numpy.stack([start, end], axis=1)

    def eval_metrics(outputs: list[dict]) -> dict:
        predictions = np.concatenate([o["predictions"] for o in outputs])  # (N, 2): argmax start, argmax end
        answers = []
        for row, (start, end) in enumerate(predictions):
            context = set(eval_set.context_rows[row])
            valid = start in context and end in context and start <= end  # else: no answer (as [CLS])
            offsets, text = eval_set.offsets[row], eval_set.examples[row].context
            answers.append(text[offsets[start][0] : offsets[end][1]] if valid else "")
        golds = [[t for t, _ in e.answers] or [""] for e in eval_set.examples]
        return {f"eval_{k}": v for k, v in squad_scores(answers, golds).items()}

    return _fine_tune(
        config, started, model_config, module, source_params, train_set, eval_set, data_card, tokenizer,
        architecture="BiGSForQuestionAnswering", apply_fn=apply_fn, eval_metrics=eval_metrics,
    )  # fmt: skip


def _token_classification(config: TrainConfig, started: float) -> Path:
    model_config, source_params = load_artifact(config.init_from)
    max_length = min(config.data.seq_len, model_config.max_position_embeddings)
    tokenizer = bert_uncased_tokenizer(model_max_length=model_config.max_position_embeddings)
    train, held_out, data_card = _span_data(config, read_tagged, lambda s: " ".join(s.words))
    names = label_names(train)
    label2id = {name: i for i, name in enumerate(names)}
    data_card["id2label"] = dict(enumerate(names))
    train_set = encode_tagged(train, tokenizer, max_length, label2id)
    eval_set = encode_tagged(held_out, tokenizer, max_length, label2id)
    model_config.num_labels = len(names)
    model_config.id2label = dict(enumerate(names))
    model_config.label2id = label2id
    model_config.hidden_dropout_prob = config.model.hidden_dropout_prob
    module = FlaxBiGSForTokenClassificationModule(model_config, **compute_precision(config.dtype).module_kwargs())

    def eval_metrics(outputs: list[dict]) -> dict:
        """Entity F1 over words: each word's tag is its first piece's (the positions labelled in the data)."""
        gold, predicted = [], []
        for o in outputs:
            for labels, guesses in zip(o["labels"], o["predictions"], strict=True):
                first_pieces = labels != -100
                gold.append([names[i] for i in labels[first_pieces]])
                predicted.append([names[i] for i in guesses[first_pieces]])
        return {f"eval_{k}": v for k, v in entity_f1(gold, predicted).items()}

    return _fine_tune(
        config, started, model_config, module, source_params, train_set, eval_set, data_card, tokenizer,
        architecture="BiGSForTokenClassification", apply_fn=module.apply, eval_metrics=eval_metrics,
    )  # fmt: skip


def _stage_card(config: TrainConfig, data_card: dict) -> dict:
    """What the stage knows before training: the run's settings, its data, the machine and precision."""
    return {
        "stage": config.stage,
        "config": config.run_settings(),
        "data": data_card,
        "device": device_description(),
        "compute_precision": compute_precision(config.dtype).describe(),
    }


def _card(stage_card: dict, trainer: Trainer, held_out: dict, started: float) -> dict:
    """The final artifact's card. Tokens and training time are the run's, over all its slices; the
    throughput is the last slice's (each slice records its own tokens/s)."""
    return {
        **stage_card,
        "steps": trainer.config.num_steps,
        "tokens_seen": trainer.tokens_seen,
        "tokens_per_s": trainer.tokens_seen / max(trainer.wall_time_s, 1e-9),
        "train_wall_time_s": trainer.wall_time_s,
        "wall_time_s": time.time() - started,
        "held_out": held_out,
        "throughput": trainer.throughput.summary() if trainer.throughput else None,
        "slices": trainer.slices.read(),
    }


def embedding_dense_of(params: dict):
    """The sentence-embedding projection a distilled run trained, as the artifact's Dense (kernel, bias):
    the served embedding is then the teacher-space vector the run fitted. None where there is none."""
    sentence = params.get(PROJECTIONS_KEY, {}).get("sentence")
    return None if sentence is None else (sentence["kernel"], sentence["bias"])


def _card_of(model_dir: Path) -> dict | None:
    """The held-out figures of a dir's training card, where it has one (what a student's card says of
    the teacher whose answers it learned)."""
    path = Path(model_dir) / "training_card.json"
    if not path.is_file():
        return None
    import json

    card = json.loads(path.read_text())
    return {k: card.get(k) for k in ("stage", "steps", "tokens_seen", "held_out")}


def _weights_writer(
    model_config, architecture: str, tokenizer, stage_card: dict, with_dense: bool = False, bert_base=None
):
    """What every checkpoint leaves beside it (training/slices.py): the weights as an artifact dir in
    fp16 (the shipped format), its card the stage's plus the trainer's (step, data position, slices).
    Weights beyond fp16's range are stored in fp32 rather than failing the run, and the card says so.
    `with_dense`: the run's sentence-embedding projection goes with them (2_Dense)."""

    def write(out_dir: Path, params, trainer_card: dict) -> Path:
        card = {**stage_card, **trainer_card}
        dense = embedding_dense_of(params) if with_dense else None
        params = student_params(params)  # the other projections stay in the run's checkpoints
        try:
            return write_artifact(
                out_dir, model_config, params, architecture, card, tokenizer, "float16", dense, bert_base
            )
        except ValueError as error:  # a weight past fp16's range
            card["weights_storage"] = f"float32: {error}"
            return write_artifact(
                out_dir, model_config, params, architecture, card, tokenizer, "float32", dense, bert_base
            )

    return write


def _stopped(config: TrainConfig, trainer: Trainer) -> Path:
    """A slice that stopped before num_steps: its checkpoint and weights dir are the result (no
    artifact dir, no final evaluation; trainer.fit printed where it stopped and how to go on)."""
    if trainer.writer and trainer.metrics_path.is_file():
        plot_curves(trainer.metrics_path, Path(config.output_dir) / "curves.png")
    return weights_dir(config.output_dir, trainer.step)


def _finish(
    config: TrainConfig,
    trainer: Trainer,
    model_config,
    architecture: str,
    card: dict,
    tokenizer,
    with_dense=False,
    bert_base=None,
) -> Path:
    out = Path(config.output_dir)
    params = trainer.final_params()  # every process: gathering the final parameters is a collective
    if not trainer.writer:  # one process writes the run dir's files; two writing one artifact race
        return out / "artifact"
    plot_curves(trainer.metrics_path, out / "curves.png")
    artifact = write_artifact(
        out / "artifact", model_config, student_params(params), architecture, card, tokenizer,
        weights_storage=config.weights_storage, embedding_dense=embedding_dense_of(params) if with_dense else None,
        bert_base=bert_base,
    )  # fmt: skip
    print(f"wrote {artifact}; held-out: {card['held_out']}")
    return artifact
