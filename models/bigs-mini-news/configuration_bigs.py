"""BiGSConfig: the hyper-parameters of a BiGS encoder.

Accepts every field of the published configuration (jxiw/BiGS), so a published `config.json`
loads unchanged, and adds the switches this project needs (how padding is treated, which SSM
convolution formulation runs). Unknown fields are kept, as `PretrainedConfig` does.
"""

from __future__ import annotations

import math

from transformers import PretrainedConfig

SSM_FORMULATIONS = ("fft", "toeplitz", "chunked", "direct")
# The paper's controlled comparison (Table 1): the block × how tokens exchange information, and the other
# encoders of the field as rows of the same family (docs/DESIGN.md §2.7, §2.8).
BLOCK_TYPES = ("gated", "stack", "gmlp")
ROUTINGS = ("ssm", "attention", "alibi", "synthesizer-random", "synthesizer-dense", "spatial")
# The gMLP block routes through its own spatial gating unit, and only it does.
GMLP_ROUTING = "spatial"
# Routings that carry a learned matrix over positions of a fixed size N = max_position_embeddings: the
# model is defined for inputs of at most N tokens and is trained, exported and served at N.
FIXED_LENGTH_ROUTINGS = ("spatial", "synthesizer-random", "synthesizer-dense")
MLM_HEADS = ("bert", "clap")
# Initial values shared by the torch and Flax models (docs/DESIGN.md §2.8). The CLAP head's inverse temperature:
# h at the last layer has a norm of about √d, so the logits β·|h|·cos start on the scale of CLIP's 1/0.07 × cos
# at the comparison's width (d = 256). gMLP's spatial weight: uniform in ±SPATIAL_INIT_SCALE / N ("near zero").
CLAP_INITIAL_BETA = 1.0
SPATIAL_INIT_SCALE = 1e-3


def alibi_slopes(num_heads: int) -> list[float]:
    """The per-head slopes m of ALiBi (Press et al., "Train Short, Test Long"): for h a power of two the
    geometric sequence 2^(−8/h), 2^(−16/h), …, 2^(−8); otherwise the h' = 2^⌊log2 h⌋ slopes of h', then
    every other slope of 2h' for the heads left over (the paper's recipe). Plain floats, so the torch and
    Flax models add the same biases."""

    def power_of_two(n: int) -> list[float]:
        start = 2.0 ** (-8.0 / n)
        return [start ** (i + 1) for i in range(n)]

    if num_heads & (num_heads - 1) == 0:
        return power_of_two(num_heads)
    below = 2 ** math.floor(math.log2(num_heads))
    return power_of_two(below) + alibi_slopes(2 * below)[0::2][: num_heads - below]


class BiGSConfig(PretrainedConfig):
    r"""Configuration of a BiGS model (bidirectional gated SSM encoder, "Pretraining Without Attention").

    Args:
        vocab_size: size of the WordPiece vocabulary (30,522 for BERT uncased).
        hidden_size: d, the width of the residual stream.
        num_hidden_layers: number of layers (blocks).
        intermediate_size: I, the width of the gate branch V and of the output MLP (3d in the paper) of a
            gated block; the width of the feed-forward of a stack block.
        hidden_act: activation of the MLM head transform ("gelu" = exact erf GELU).
        hidden_dropout_prob: dropout after the embeddings and before the classifier.
        max_position_embeddings: number of learned absolute positions = the longest input.
        type_vocab_size: number of segment (token type) embeddings.
        initializer_range: std of the normal init of dense and embedding weights.
        layer_norm_eps: epsilon of every LayerNorm (1e-12, as BERT).
        pad_token_id: id of [PAD].
        position_embedding_type: only "absolute" is used by BiGS.
        classifier_dropout: dropout before the classifier; defaults to hidden_dropout_prob.
        num_ssm: N, number of complex S4D modes per SSM (64).
        pre_norm: LayerNorm before the gated block (True, the published setting) or after the residual.
        decode: published field for recurrent decoding; accepted and ignored (BiGS is an encoder).
        pooler_type: "non_padding_mean" (mean over real tokens) or "mean" (over all positions).
        use_pykeops_kernel: published field; accepted and ignored (the kernel is computed in closed form).
        mask_padding_in_ssm: zero the SSM inputs at padded positions so that a sequence's outputs do not
            depend on how far it is padded or what it is batched with (default). False reproduces the
            published code, where the backward SSM reads the pad positions of a right-padded sequence.
        ssm_formulation: how the SSM causal convolution is computed in the torch model: "fft" (the
            reference), "toeplitz" (an L x L lower-triangular matmul), "chunked" (the semiseparable
            chunked form) or "direct" (O(L^2) sum, for tests). All give the same function.
        ssm_chunk_size: chunk length of the "chunked" formulation.
        block_type: "gated" (the BiGS layer, the default: the routing output gates a GELU branch, one
            residual per layer), "stack" (BERT's layout: routing then feed-forward, each with its own
            residual and LayerNorm) or "gmlp" (gMLP: a channel MLP whose hidden layer is gated by its spatial
            gating unit). docs/DESIGN.md §2.7, §2.8.
        routing: how positions exchange information inside a block: "ssm" (the forward and backward
            SSMs, the default), "attention" (bidirectional multi-head self-attention, pad keys masked),
            "alibi" (the same attention with linear distance biases instead of position embeddings),
            "synthesizer-random" (a learned N × N alignment per head, softmaxed), "synthesizer-dense" (the
            alignment of each token predicted by a two-layer MLP), or "spatial" (the gMLP block's spatial
            gating unit; the only routing of that block and its default). block_type="stack",
            routing="attention" is BERT. The spatial and synthesizer routings are tied to
            N = max_position_embeddings (`fixed_length`).
        num_attention_heads: heads of the attention and synthesizer routings; defaults to hidden_size / 64
            (at least 1). Must divide hidden_size. Recorded but unused with the ssm and spatial routings.
        mlm_head: "bert" (dense → GELU → LayerNorm → tied decoder + bias, the published head) or "clap"
            (β · normalize(E) · h: the tied token embeddings L2-normalised, a learned inverse temperature β,
            nothing else). docs/DESIGN.md §2.8.
    """

    model_type = "BiGS"

    def __init__(
        self,
        vocab_size: int = 30522,
        hidden_size: int = 768,
        num_hidden_layers: int = 24,
        intermediate_size: int = 3072,
        hidden_act: str = "gelu",
        hidden_dropout_prob: float = 0.1,
        max_position_embeddings: int = 512,
        type_vocab_size: int = 2,
        initializer_range: float = 0.02,
        layer_norm_eps: float = 1e-12,
        pad_token_id: int = 0,
        position_embedding_type: str = "absolute",
        use_cache: bool = True,
        classifier_dropout: float | None = None,
        num_ssm: int = 64,
        pre_norm: bool = True,
        decode: bool = False,
        pooler_type: str = "non_padding_mean",
        use_pykeops_kernel: bool = False,
        mask_padding_in_ssm: bool = True,
        ssm_formulation: str = "fft",
        ssm_chunk_size: int = 256,
        block_type: str = "gated",
        routing: str | None = None,
        num_attention_heads: int | None = None,
        mlm_head: str = "bert",
        **kwargs,
    ):
        # Published checkpoints were trained with tied input/output embeddings.
        kwargs.setdefault("tie_word_embeddings", True)
        super().__init__(pad_token_id=pad_token_id, **kwargs)
        if pooler_type not in ("non_padding_mean", "mean"):
            raise ValueError(f"pooler_type must be 'non_padding_mean' or 'mean', got {pooler_type!r}")
        if ssm_formulation not in SSM_FORMULATIONS:
            raise ValueError(f"ssm_formulation must be one of {SSM_FORMULATIONS}, got {ssm_formulation!r}")
        if block_type not in BLOCK_TYPES:
            raise ValueError(f"block_type must be one of {BLOCK_TYPES}, got {block_type!r}")
        if routing is None:  # each block's own default: the SSM pair, or gMLP's spatial gating unit
            routing = GMLP_ROUTING if block_type == "gmlp" else "ssm"
        if routing not in ROUTINGS:
            raise ValueError(f"routing must be one of {ROUTINGS}, got {routing!r}")
        if (block_type == "gmlp") != (routing == GMLP_ROUTING):
            raise ValueError(
                f"routing={GMLP_ROUTING!r} is the gmlp block's spatial gating unit and that block's only routing, "
                f"got block_type={block_type!r} with routing={routing!r}"
            )
        if mlm_head not in MLM_HEADS:
            raise ValueError(f"mlm_head must be one of {MLM_HEADS}, got {mlm_head!r}")
        if mlm_head == "clap" and not kwargs["tie_word_embeddings"]:
            raise ValueError("mlm_head='clap' scores against the token embeddings: tie_word_embeddings must be True")
        if block_type == "gmlp" and intermediate_size % 2:
            raise ValueError(
                f"the gmlp block splits intermediate_size in two halves: it must be even, got {intermediate_size}"
            )
        if num_attention_heads is None:
            num_attention_heads = max(1, hidden_size // 64)
        if (
            isinstance(num_attention_heads, bool)
            or not isinstance(num_attention_heads, int)
            or num_attention_heads < 1
            or hidden_size % num_attention_heads
        ):
            raise ValueError(
                f"num_attention_heads must be a positive integer dividing hidden_size={hidden_size}, "
                f"got {num_attention_heads!r}"
            )
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.intermediate_size = intermediate_size
        self.hidden_act = hidden_act
        self.hidden_dropout_prob = hidden_dropout_prob
        self.max_position_embeddings = max_position_embeddings
        self.type_vocab_size = type_vocab_size
        self.initializer_range = initializer_range
        self.layer_norm_eps = layer_norm_eps
        self.position_embedding_type = position_embedding_type
        self.use_cache = use_cache
        self.classifier_dropout = classifier_dropout
        self.num_ssm = num_ssm
        self.pre_norm = pre_norm
        self.decode = decode
        self.pooler_type = pooler_type
        self.use_pykeops_kernel = use_pykeops_kernel
        self.mask_padding_in_ssm = mask_padding_in_ssm
        self.ssm_formulation = ssm_formulation
        self.ssm_chunk_size = ssm_chunk_size
        self.block_type = block_type
        self.routing = routing
        self.num_attention_heads = num_attention_heads
        self.mlm_head = mlm_head

    @property
    def fixed_length(self) -> int | None:
        """N for a model tied to a number of positions (a learned N × N matrix over positions: the gMLP
        and synthesizer routings), which it is trained, exported and served at; None for a model of any
        length up to max_position_embeddings."""
        return self.max_position_embeddings if self.routing in FIXED_LENGTH_ROUTINGS else None

    @property
    def has_position_embeddings(self) -> bool:
        """False with ALiBi: positions enter as distance biases of the attention, not as a learned table."""
        return self.routing != "alibi"

    @property
    def classifier_dropout_rate(self) -> float:
        """The dropout before a classifier head (torch and Flax): `classifier_dropout`, else `hidden_dropout_prob`."""
        return self.classifier_dropout if self.classifier_dropout is not None else self.hidden_dropout_prob

    def save_pretrained(self, save_directory, push_to_hub: bool = False, **kwargs):
        """config.json as transformers writes it, then the model code and `auto_map` beside it
        (model/hub.py), so the dir loads in transformers with the project not installed."""
        super().save_pretrained(save_directory, push_to_hub=push_to_hub, **kwargs)
        from .hub import write_remote_code

        write_remote_code(save_directory)
