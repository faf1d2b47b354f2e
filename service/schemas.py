"""Request and response bodies, in wire formats clients already speak.

Requests are `{"inputs": …, "parameters": {…}, "model": optional name}` as in the Hugging Face
Inference API. Fill-mask answers `[{"sequence","score","token","token_str"}]`, classification
answers `[{"label","score"}]` sorted by score, as `transformers.pipeline` does. Truncation follows
TEI: `truncate` (default false) cuts inputs longer than the model instead of answering 413.

Inputs are strict: numbers must be JSON numbers (`top_k` an integer: not "5", 5.0 or true), switches
JSON booleans (`truncate`: not "yes" or 1). Lists are bounded here, so that pydantic stops at their
length instead of validating (and building an error for) each of a million items.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, field_validator

# The most items a list of inputs may have before validation stops: a ceiling far above
# `max_inputs_per_request` (default 64, the limit that applies, answered by the engine), so raising
# that setting needs no change here, while a list of a million items fails at once on its length.
MAX_LIST_INPUTS = 1024
MAX_TARGETS = 1000
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


class TextPair(_Body):
    text: str
    text_pair: str | None = None

    @field_validator("text_pair")
    @classmethod
    def check_pair(cls, value):
        return value if value is None else _encodable(value)


class FillMaskParameters(_Body):
    top_k: StrictInt = Field(5, ge=1, le=100, description="candidates per [MASK]")
    targets: Annotated[list[str], Field(max_length=MAX_TARGETS)] | str | None = Field(
        None,
        description=f"score only these candidate words (at most {MAX_TARGETS}); a word that is not one token "
        "of the vocabulary is scored as its first word piece, as transformers' fill-mask pipeline does",
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
        for text in [value] if isinstance(value, str) else value:
            _not_blank(text)
        if isinstance(value, list) and not value:
            raise ValueError("inputs is an empty list")
        return value


class ClassifyParameters(_Body):
    top_k: StrictInt | None = Field(None, ge=1, description="labels to return; default all, sorted by score")
    function_to_apply: Literal["softmax", "sigmoid", "none"] | None = Field(
        None, description="default: sigmoid for multi-label or single-output models, else softmax"
    )
    truncate: StrictBool = Field(False, description="cut inputs longer than the model instead of answering 413")


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
    """Whole documents up to the model's longest bucket (4,096 tokens), in one forward pass.
    `text_pair` is an optional short query placed after the document."""


class EmbedParameters(_Body):
    normalize: StrictBool = Field(True, description="L2-normalise each embedding")
    truncate: StrictBool = Field(False, description="cut inputs longer than the model instead of answering 413")


class EmbedRequest(_Body):
    inputs: str | TextList
    parameters: EmbedParameters = Field(default_factory=EmbedParameters)
    model: str | None = None

    @field_validator("inputs")
    @classmethod
    def check_inputs(cls, value):
        items = [value] if isinstance(value, str) else value
        if not items:
            raise ValueError("inputs is an empty list")
        for text in items:
            _not_blank(text)
        return value


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
    name: str
    tasks: list[str]
    labels: list[str] | None
    max_length: int
    buckets: list[int]
    runtime: str


class ModelsResponse(BaseModel):
    models: list[ModelCard]


class ErrorBody(BaseModel):
    error: str
    error_type: str
