"""Request and response bodies, in wire formats clients already speak.

Requests under /v1 are `{"inputs": …, "parameters": {…}, "model": optional name}` as in the Hugging
Face Inference API. Fill-mask answers `[{"sequence","score","token","token_str"}]`, classification
answers a list of `[{"label","score"}]` sorted by score per input, as the Inference API does.
Truncation follows TEI: `truncate` (default false) cuts inputs longer than the model instead of
answering 413. OpenAI's embeddings and model list, and text-embeddings-inference's (TEI) routes,
have their own bodies below, in those services' JSON.

Inputs are strict: numbers must be JSON numbers (`top_k` an integer: not "5", 5.0 or true), switches
JSON booleans (`truncate`: not "yes" or 1). Lists are bounded here, so that pydantic stops at their
length instead of validating (and building an error for) each of a million items.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    field_validator,
    model_validator,
)

# The most items a list of inputs may have before validation stops: a ceiling far above
# `max_inputs_per_request` (default 64, the limit that applies, answered by the engine), so raising
# that setting needs no change here, while a list of a million items fails at once on its length.
MAX_LIST_INPUTS = 1024
MAX_TARGETS = 1000
# A fill-mask target is a word (scored as its first word piece): one of 4 MB was tokenized whole on the
# event loop (5.6 s, +870 MB). Far above any word WordPiece splits (100 characters; longer is [UNK]).
MAX_TARGET_CHARS = 1000
Target = Annotated[str, Field(max_length=MAX_TARGET_CHARS)]
TextList = Annotated[list[str], Field(max_length=MAX_LIST_INPUTS)]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _encodable(text: str) -> str:
    """JSON may carry lone surrogates (e.g. "\\ud800"), which no tokenizer can take: refuse them (422)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("text is not valid Unicode (it has a lone surrogate)") from None
    return text


def _not_blank(text: str) -> str:
    if not text.strip():
        raise ValueError("text is empty")
    return _encodable(text)


def _text_or_texts(value: str | list[str]) -> str | list[str]:
    """`inputs` that is one text or a non-empty list of texts, none of them blank."""
    items = [value] if isinstance(value, str) else value
    if not items:
        raise ValueError("inputs is an empty list")
    for text in items:
        _not_blank(text)
    return value


# What an input longer than the model gets (embeddings and classification): "error" 413, "truncate" cut
# at the model's length (what `truncate: true` has always meant), "chunk" read in overlapping windows
# whose results are pooled (service/chunking.py). Default: "truncate" when `truncate` is true, else "error".
Overflow = Literal["error", "truncate", "chunk"]
OVERFLOW_DESCRIPTION = (
    'an input longer than the model: "error" (413), "truncate" (cut at the model\'s length; the same as '
    '"truncate": true), or "chunk" (read in overlapping windows of the model\'s length, their results pooled: '
    "embeddings by token-weighted mean, classification by the mean of the logits; the x-windows header says how "
    'many windows each input took). Default: "truncate" when truncate is true, else "error"'
)


def overflow_field():
    # x-heaviest: the choice that costs the service the most (tests/largest_requests.py sends it)
    return Field(None, description=OVERFLOW_DESCRIPTION, json_schema_extra={"x-heaviest": "chunk"})


def resolve_overflow(truncate: bool | None, overflow: Overflow | None) -> Overflow:
    """The one policy `truncate` and `overflow` give together; a contradiction is a ValueError (422)."""
    if overflow is None:
        return "truncate" if truncate else "error"
    if truncate and overflow != "truncate":
        raise ValueError(f'truncate: true cuts long inputs, overflow "{overflow}" does not: give one of them')
    return overflow


class TextPair(_Body):
    text: str
    text_pair: str | None = None

    @field_validator("text_pair")
    @classmethod
    def check_pair(cls, value):
        return value if value is None else _encodable(value)


class FillMaskParameters(_Body):
    top_k: StrictInt = Field(5, ge=1, le=100, description="candidates per [MASK]")
    targets: Annotated[list[Target], Field(max_length=MAX_TARGETS)] | Target | None = Field(
        None,
        description=f"score only these candidate words (at most {MAX_TARGETS}, of at most {MAX_TARGET_CHARS} "
        "characters each); a word that is not one token of the vocabulary is scored as its first word piece, "
        "as transformers' fill-mask pipeline does",
    )

    @field_validator("targets")
    @classmethod
    def check_targets(cls, value):
        for word in [value] if isinstance(value, str) else value or []:
            _encodable(word)
        return value


class FillMaskRequest(_Body):
    inputs: str | TextList = Field(..., description="text with one or more [MASK] tokens, or a list of texts")
    parameters: FillMaskParameters = Field(default_factory=FillMaskParameters)
    model: str | None = None

    @field_validator("inputs")
    @classmethod
    def check_inputs(cls, value):
        return _text_or_texts(value)


class ClassifyParameters(_Body):
    top_k: StrictInt | None = Field(None, ge=1, description="labels to return; default all, sorted by score")
    function_to_apply: Literal["softmax", "sigmoid", "none"] | None = Field(
        None, description="default: sigmoid for multi-label or single-output models, else softmax"
    )
    truncate: StrictBool = Field(False, description="cut inputs longer than the model instead of answering 413")
    overflow: Overflow | None = overflow_field()

    @model_validator(mode="after")
    def one_policy(self):
        self.overflow = resolve_overflow(self.truncate, self.overflow)
        self.truncate = self.overflow == "truncate"
        return self


ClassifyInput = str | TextPair
ClassifyInputList = Annotated[list[ClassifyInput], Field(max_length=MAX_LIST_INPUTS)]


class ClassifyRequest(_Body):
    inputs: ClassifyInput | ClassifyInputList
    parameters: ClassifyParameters = Field(default_factory=ClassifyParameters)
    model: str | None = None

    @field_validator("inputs")
    @classmethod
    def check_inputs(cls, value):
        items = value if isinstance(value, list) else [value]
        if not items:
            raise ValueError("inputs is an empty list")
        for item in items:
            _not_blank(item if isinstance(item, str) else item.text)
        return value


class DocumentClassifyRequest(ClassifyRequest):
    """Whole documents up to the model's longest bucket (4,096 tokens for the defaults; 16,384 exported with
    `--tile-positions`), in one forward pass.
    `text_pair` is an optional short query placed after the document."""


PROMPT_NAME_DESCRIPTION = (
    "put this prompt of the model before each text (sentence-transformers' `prompts` in the model dir's "
    "config_sentence_transformers.json); default: its `default_prompt_name`, if any; a name it has not is 422"
)
PromptName = Annotated[str, Field(max_length=MAX_TARGET_CHARS)]


class EmbedParameters(_Body):
    normalize: StrictBool = Field(True, description="L2-normalise each embedding")
    prompt_name: PromptName | None = Field(None, description=PROMPT_NAME_DESCRIPTION)
    truncate: StrictBool = Field(False, description="cut inputs longer than the model instead of answering 413")
    overflow: Overflow | None = overflow_field()

    @model_validator(mode="after")
    def one_policy(self):
        self.overflow = resolve_overflow(self.truncate, self.overflow)
        self.truncate = self.overflow == "truncate"
        return self


class EmbedRequest(_Body):
    inputs: str | TextList
    parameters: EmbedParameters = Field(default_factory=EmbedParameters)
    model: str | None = None

    @field_validator("inputs")
    @classmethod
    def check_inputs(cls, value):
        return _text_or_texts(value)


class QuestionContext(_Body):
    question: str
    context: str

    @field_validator("question", "context")
    @classmethod
    def check_text(cls, value):
        return _not_blank(value)


class QuestionAnsweringParameters(_Body):
    top_k: StrictInt = Field(1, ge=1, le=100, description="answers per input (fewer when fewer spans exist)")
    max_answer_len: StrictInt = Field(15, ge=1, le=512, description="longest answer, in tokens")
    handle_impossible_answer: StrictBool = Field(
        False, description="let the no-answer ([CLS]'s score) compete; it answers {answer: '', start: 0, end: 0}"
    )
    truncate: StrictBool = Field(
        False, description="cut a context longer than the model (never the question) instead of answering 413"
    )


class QuestionAnsweringRequest(_Body):
    inputs: QuestionContext | Annotated[list[QuestionContext], Field(max_length=MAX_LIST_INPUTS)]
    parameters: QuestionAnsweringParameters = Field(default_factory=QuestionAnsweringParameters)
    model: str | None = None

    @field_validator("inputs")
    @classmethod
    def check_inputs(cls, value):
        if isinstance(value, list) and not value:
            raise ValueError("inputs is an empty list")
        return value


class QuestionAnswer(BaseModel):
    answer: str
    score: float
    start: int = Field(description="first character of the answer in the context")
    end: int = Field(description="the character after the answer's last")


class TokenClassificationParameters(_Body):
    aggregation_strategy: Literal["none", "simple", "first", "average", "max"] = Field(
        "none", description="as transformers' token-classification pipeline"
    )
    ignore_labels: Annotated[list[str], Field(max_length=MAX_TARGETS)] = Field(
        default_factory=lambda: ["O"], description="entities with these labels are left out"
    )
    truncate: StrictBool = Field(False, description="cut inputs longer than the model instead of answering 413")


class TokenClassificationRequest(_Body):
    inputs: str | TextList
    parameters: TokenClassificationParameters = Field(default_factory=TokenClassificationParameters)
    model: str | None = None

    @field_validator("inputs")
    @classmethod
    def check_inputs(cls, value):
        return _text_or_texts(value)


class TokenEntity(BaseModel):
    """A token (aggregation none: `entity` and `index`) or a group of them (`entity_group`)."""

    entity: str | None = None
    entity_group: str | None = None
    score: float
    index: int | None = Field(None, description="the token's position in the input (aggregation none)")
    word: str
    start: int
    end: int


class FillMaskCandidate(BaseModel):
    sequence: str
    score: float
    token: int
    token_str: str


class LabelScore(BaseModel):
    label: str
    score: float


class EmbedResponse(BaseModel):
    embeddings: list[list[float]]
    dimensions: int


class ModelCard(BaseModel):
    """One served model as an item of OpenAI's model list, with this service's fields besides."""

    id: str
    object: Literal["model"] = "model"
    created: int = Field(description="when the model was loaded (Unix seconds)")
    owned_by: str = "bigs-serving"
    status: Literal["ready", "failed"] = "ready"
    tasks: list[str] = Field(default_factory=list, description="the heads it serves")
    labels: list[str] | None = None
    max_length: int | None = None
    positions_tiled_from: int | None = Field(
        None,
        description="the positions the model learned, where it reads past them up to max_length with the learned "
        "position table tiled and no training (`bigs export --tile-positions`); absent: every position learned",
    )
    dimensions: int | None = Field(None, description="the width of its embeddings (/v1/embeddings `dimensions`)")
    buckets: list[int] | None = None
    runtime: str | None = None
    precision: str | None = Field(
        None,
        description="the precision served: fp32, int8, bf16 or int8-openvino, or mixed (then per bucket: bucket_precisions)",
    )
    bucket_precisions: dict[int, str] | None = Field(
        None, description="the precision each bucket is served at (precision auto decides per bucket)"
    )
    error: str | None = Field(None, description="why it failed to load (skip_failed_models)")


class ModelsResponse(BaseModel):
    """OpenAI's list shape: `{"object": "list", "data": [model, …]}`."""

    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorBody(BaseModel):
    error: str
    error_type: str


# -- OpenAI embeddings --------------------------------------------------------------------------

# A ceiling on one list of token ids, far above any model's length (4,096; 16,384 with tiled positions), so that
# validation stops at the length of a list of a million ids; the model's own limit is the engine's (413).
MAX_TOKEN_IDS = 65536
TokenIds = Annotated[list[Annotated[int, Field(strict=True, ge=0)]], Field(min_length=1, max_length=MAX_TOKEN_IDS)]
"""Token ids of the model's own vocabulary (as /tokenize answers), the model's whole input: taken as
given ([CLS]/[SEP] included when wanted), never truncated."""


class OpenAIEmbeddingsRequest(BaseModel):
    model_config = ConfigDict(
        extra="ignore",  # OpenAI clients may send fields of newer API versions (e.g. "user")
        json_schema_extra={"examples": [{"model": "bigs-mini", "input": ["the cat sat", "a dog ran"]}]},
    )

    model: str = Field(..., description="a served model's id (GET /v1/models)")
    input: (
        str
        | TokenIds
        | Annotated[list[str], Field(min_length=1, max_length=MAX_LIST_INPUTS)]
        | Annotated[list[TokenIds], Field(min_length=1, max_length=MAX_LIST_INPUTS)]
    ) = Field(..., description="a text, a list of texts, token ids, or a list of token-id lists")
    encoding_format: Literal["float", "base64"] = Field(
        "float", description="base64: each vector as little-endian float32 bytes, base64-encoded"
    )
    dimensions: StrictInt | None = Field(
        None, ge=1, description="only the model's own size: its embeddings are not trained to be cut"
    )
    user: str | None = None
    prompt_name: PromptName | None = Field(None, description=PROMPT_NAME_DESCRIPTION)
    overflow: Overflow = Field(
        "error", description=OVERFLOW_DESCRIPTION.split(". Default")[0], json_schema_extra={"x-heaviest": "chunk"}
    )

    @field_validator("input")
    @classmethod
    def check_input(cls, value):
        for item in [value] if isinstance(value, str) else value:
            if isinstance(item, str):
                _not_blank(item)
        return value


class OpenAIEmbedding(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str


class OpenAIUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class OpenAIEmbeddingsResponse(BaseModel):
    object: Literal["list"] = "list"
    data: list[OpenAIEmbedding]
    model: str
    usage: OpenAIUsage


# -- text-embeddings-inference (TEI) --------------------------------------------------------------


class _TEIBody(_Body):
    truncate: StrictBool | None = Field(False, description="cut inputs longer than the model instead of 413")
    truncation_direction: Literal["right", "Right"] = Field(
        "right", description="only right: inputs are cut at their end"
    )

    @property
    def truncating(self) -> bool:
        return bool(self.truncate)


class _TEIOverflow(_TEIBody):
    """TEI's /embed and /predict, with this service's `overflow` besides TEI's `truncate`."""

    overflow: Overflow | None = overflow_field()

    @model_validator(mode="after")
    def one_policy(self):
        self.overflow = resolve_overflow(self.truncate, self.overflow)
        return self


TEIInput = str | TokenIds
TEIInputs = TEIInput | Annotated[list[TEIInput], Field(min_length=1, max_length=MAX_LIST_INPUTS)]


def _check_texts(items) -> None:
    for item in items:
        if isinstance(item, str):
            _not_blank(item)


def _texts(items: list[str]) -> list[str]:
    _check_texts(items)
    return items


# The two sides of TEI's comparisons (/rerank's query and texts, /similarity's source sentence and sentences):
# a text that is not blank, and a non-empty, bounded list of such texts.
ComparedText = Annotated[str, AfterValidator(_not_blank)]
ComparedTexts = Annotated[list[str], Field(min_length=1, max_length=MAX_LIST_INPUTS), AfterValidator(_texts)]


class TEIEmbedRequest(_TEIOverflow):
    model_config = ConfigDict(
        extra="forbid", json_schema_extra={"examples": [{"inputs": ["the cat sat", "a dog ran"], "normalize": True}]}
    )

    inputs: TEIInputs
    normalize: StrictBool = True
    prompt_name: PromptName | None = Field(None, description=PROMPT_NAME_DESCRIPTION)
    dimensions: StrictInt | None = Field(None, ge=1, description="only the model's own size")

    @field_validator("inputs")
    @classmethod
    def check_inputs(cls, value):
        return _check_tei_inputs(value)


class TEIEmbedAllRequest(_TEIBody):
    """TEI's /embed_all: a vector per token. Longer than the model is 413 unless `truncate` (no windows:
    a token's vector is its place in one pass)."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"inputs": "the cat sat"}]})

    inputs: TEIInputs
    prompt_name: PromptName | None = Field(None, description=PROMPT_NAME_DESCRIPTION)

    @field_validator("inputs")
    @classmethod
    def check_inputs(cls, value):
        return _check_tei_inputs(value)


def _check_tei_inputs(value):
    """TEI's inputs (a text, a list of token ids, or a list of either): every text not blank."""
    _check_texts([value] if isinstance(value, str) or _is_ids(value) else value)
    return value


def _is_ids(value) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(v, int) for v in value)


def tei_items(inputs) -> tuple[list, bool]:
    """TEI inputs as a list, and whether they were a batch: a text or one list of token ids is one input."""
    if isinstance(inputs, str) or _is_ids(inputs):
        return [inputs], False
    return list(inputs), True


NonBlank = Annotated[str, Field(min_length=1)]
PredictPair = Annotated[list[str], Field(min_length=1, max_length=2)]


class TEIPredictRequest(_TEIOverflow):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {"inputs": "What is deep learning?"},
                {"inputs": ["What is deep learning?", "Deep learning is ..."]},
                {"inputs": [["a single text"], ["a text", "its pair"]], "raw_scores": False},
            ]
        },
    )

    inputs: str | PredictPair | Annotated[list[PredictPair], Field(min_length=1, max_length=MAX_LIST_INPUTS)] = Field(
        ..., description="a text, a pair [text, text_pair], or a batch of [text] and [text, text_pair]"
    )
    raw_scores: StrictBool = Field(False, description="the logits, not softmax / sigmoid scores")

    @field_validator("inputs")
    @classmethod
    def check_inputs(cls, value):
        if isinstance(value, list) and value and isinstance(value[0], str) and len(value) != 2:
            raise ValueError("a pair is [text, text_pair]; a batch is a list of [text] or [text, text_pair]")
        for item in [value] if isinstance(value, str) else value:
            _check_texts([item] if isinstance(item, str) else item[:1])
            if isinstance(item, list) and len(item) == 2:
                _encodable(item[1])
        return value


class TEIRerankRequest(_TEIBody):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [{"query": "what is a cat?", "texts": ["a cat is a small pet", "the sky is blue"]}]
        },
    )

    query: ComparedText
    texts: ComparedTexts
    return_text: StrictBool = False
    raw_scores: StrictBool = Field(False, description="cross-scoring: the logit, not its sigmoid")


class TEISimilarityInput(_Body):
    source_sentence: ComparedText
    sentences: ComparedTexts


class TEISimilarityParameters(_TEIBody):
    prompt_name: PromptName | None = Field(None, description=PROMPT_NAME_DESCRIPTION)


class TEISimilarityRequest(_Body):
    """TEI's /similarity (and the Inference API's sentence-similarity): the cosine similarity of the
    source sentence's embedding and each sentence's."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [{"inputs": {"source_sentence": "a cat sat", "sentences": ["a dog ran", "the cat sat"]}}]
        },
    )

    inputs: TEISimilarityInput
    parameters: TEISimilarityParameters | None = None


class TEIRank(BaseModel):
    index: int
    score: float
    text: str | None = None


class TEITokenizeRequest(_TEIBody):
    """TEI's /tokenize, bounded as the model's inputs are: a text longer than the model is 413 unless
    `truncate` (TEI's name, from its /embed), which cuts it at the model's length."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"inputs": "the cat sat"}]})

    inputs: str | Annotated[list[str], Field(min_length=1, max_length=MAX_LIST_INPUTS)]
    add_special_tokens: StrictBool = True
    prompt_name: PromptName | None = Field(None, description=PROMPT_NAME_DESCRIPTION)

    @field_validator("inputs")
    @classmethod
    def check_inputs(cls, value):
        for text in [value] if isinstance(value, str) else value:
            _encodable(text)
        return value


class TEIToken(BaseModel):
    id: int
    text: str
    special: bool
    start: int | None
    stop: int | None


class TEIDecodeRequest(_Body):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"ids": [101, 1996, 4937, 102]}]})

    ids: TokenIds | Annotated[list[TokenIds], Field(min_length=1, max_length=MAX_LIST_INPUTS)]
    skip_special_tokens: StrictBool = True


class TEIClassifierModel(BaseModel):
    id2label: dict[str, str]
    label2id: dict[str, int]


class TEIEmbeddingModel(BaseModel):
    pooling: str


class TEIModelType(BaseModel):
    classifier: TEIClassifierModel | None = None
    embedding: TEIEmbeddingModel | None = None
    reranker: TEIClassifierModel | None = None


class TEIInfo(BaseModel):
    model_id: str
    model_sha: str | None = None
    model_dtype: str
    model_type: TEIModelType
    max_concurrent_requests: int
    max_input_length: int
    max_batch_tokens: int
    max_batch_requests: int | None = None
    max_client_batch_size: int
    auto_truncate: bool
    tokenization_workers: int
    version: str
    sha: str | None = None
    docker_label: str | None = None
