"""HTTP routes. A handler validates (the pydantic body), picks the model's engine, calls it once
and shapes the answer in the wire format; the request's path between those lives in the engine
(service/engine.py): admit → encode → submit → await → postprocess.

Three wire formats over the same engine methods (docs/DESIGN.md §4.8): the Hugging Face Inference
API's under /v1 (`api`), OpenAI's /v1/embeddings and /v1/models (`api`), and text-embeddings-
inference's /embed, /predict, /rerank, /similarity, /tokenize, /decode, /info and POST / (`tei`).
"""

from __future__ import annotations

import base64
import time

import numpy as np
import pydantic_core
from fastapi import APIRouter, Depends, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from fastapi.security import HTTPBearer
from pydantic import BaseModel, ValidationError

from export.precisions import PRECISIONS

from . import package_version
from .engine import Answer
from .errors import ServiceError, error_response
from .precision_policy import dominant_precision
from .schemas import (
    ClassifyParameters,
    ClassifyRequest,
    DocumentClassifyRequest,
    EmbedParameters,
    EmbedRequest,
    EmbedResponse,
    ErrorBody,
    FillMaskCandidate,
    FillMaskRequest,
    LabelScore,
    ModelCard,
    ModelsResponse,
    OpenAIEmbeddingsRequest,
    OpenAIEmbeddingsResponse,
    QuestionAnswer,
    QuestionAnsweringRequest,
    TEIDecodeRequest,
    TEIEmbedAllRequest,
    TEIEmbedRequest,
    TEIInfo,
    TEIPredictRequest,
    TEIRank,
    TEIRerankRequest,
    TEISimilarityParameters,
    TEISimilarityRequest,
    TEIToken,
    TEITokenizeRequest,
    TokenClassificationRequest,
    TokenEntity,
    tei_items,
)
from .state import ServiceState

FillMaskAnswer = list[FillMaskCandidate] | list[list[FillMaskCandidate]]
ERRORS = {code: {"model": ErrorBody} for code in (400, 401, 413, 415, 422, 429, 500, 503, 504)}
VERSION = package_version()


def service(request: Request) -> ServiceState:
    return request.app.state.service


# The API key is checked by the ApiKey middleware (service/app.py), before the body is read, on every
# path but `open_paths` (/health, /ready): /v1/*, the TEI routes, /metrics, /docs and /openapi.json
# alike. This dependency only declares the scheme in the OpenAPI document (auto_error off: the
# middleware has already answered 401 when a key is set and missing).
bearer = Depends(
    HTTPBearer(auto_error=False, description="`Authorization: Bearer <key>`, needed when BIGS_API_KEY is set")
)
api = APIRouter(prefix="/v1", responses=ERRORS, dependencies=[bearer])
tei = APIRouter(responses=ERRORS, dependencies=[bearer], tags=["text-embeddings-inference"])
ops = APIRouter(tags=["operations"])


# -- transport helpers ----------------------------------------------------------------------


def as_list(inputs) -> tuple[list, bool]:
    """The inputs as a list, and whether the request sent a list (answered with a list) or one."""
    return (inputs, True) if isinstance(inputs, list) else ([inputs], False)


def watch_disconnect(request: Request):
    """A `ClientGone` for the engine: returns when the client disconnects. The body has been read,
    so the next ASGI message the server has for this request is `http.disconnect` (nothing polled)."""

    async def client_gone() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    return client_gone


class Answered(JSONResponse):
    """A model's answer as JSON, written by pydantic-core's serializer (Rust): a 256-float embedding in
    23 us where `json.dumps` takes 230 (the largest cost of a small request's own, outside the model).
    The same values (a number may be spelled otherwise: 0.00001 for 1e-05); a NaN or an infinity
    becomes null, as text-embeddings-inference writes them (json.dumps would refuse them with a 500)."""

    def render(self, content) -> bytes:
        return pydantic_core.to_json(content, inf_nan_mode="null")


class Written(Response):
    """An answer the engine has already written as JSON, in a worker thread (/tokenize's can be
    megabytes: building and writing it on the event loop held every other request)."""

    media_type = "application/json"


def respond(answer: Answer, many: bool, started: float) -> JSONResponse:
    return Answered(answer.content if many else answer.content[0], headers=answer.headers(started))


def body_examples(examples: dict) -> dict:
    """`openapi_extra` for a JSON body's named examples (shown in /docs)."""
    return {"requestBody": {"content": {"application/json": {"examples": examples}}}}


def validated(model: type[BaseModel], body) -> BaseModel:
    """`body` as `model`, or the same 422 a route's own body would get."""
    try:
        return model.model_validate(body)
    except ValidationError as error:
        raise RequestValidationError(error.errors()) from None


# -- endpoints ------------------------------------------------------------------------------


FILL_MASK_DESCRIPTION = """Per input: the `top_k` candidates of its one [MASK], or a list of them per [MASK].

Limits (422 past them): at most `max_inputs_per_request` inputs (default 64), `max_masks_per_input`
[MASK] tokens per input (default 32), and `max_fill_mask_candidates` candidates in all (default 2,048):
inputs × [MASK] tokens × `top_k` (or the number of `targets`, when smaller). Each candidate carries its
whole filled-in `sequence`: ask for fewer inputs, [MASK] tokens or candidates. Inputs are never cut:
one longer than the model's maximum is 413 (fill-mask takes no `truncate`).

`targets`: at most 1,000 words. As in transformers' fill-mask pipeline, a target that is not one token
of the vocabulary is scored as its first word piece (e.g. "teapot" as "tea"), and a token given twice
is scored once."""


@api.post(
    "/fill-mask",
    summary="Fill [MASK] tokens (Hugging Face fill-mask format)",
    description=FILL_MASK_DESCRIPTION,
    # per input: candidates of its one [MASK], or a list of them per [MASK]; a list of inputs, a list of those
    responses={200: {"model": FillMaskAnswer | list[FillMaskAnswer]}},
    openapi_extra=body_examples(
        {
            "one": {"value": {"inputs": "the cat sat on the [MASK].", "parameters": {"top_k": 3}}},
            "targets": {
                "value": {"inputs": "she made [MASK] for her friend", "parameters": {"targets": ["tea", "cake"]}}
            },
        }
    ),
)
async def fill_mask(body: FillMaskRequest, request: Request):
    started = time.perf_counter()
    engine = service(request).engine_for(body.model, "fill-mask")
    texts, many = as_list(body.inputs)
    answer = await engine.fill_mask(texts, body.parameters, watch_disconnect(request))
    return respond(answer, many, started)


async def _classify(body: ClassifyRequest, request: Request, documents: bool):
    started = time.perf_counter()
    engine = service(request).engine_for(body.model, "classification")
    items, _ = as_list(body.inputs)
    pairs = [item if isinstance(item, str) else (item.text, item.text_pair) if item.text_pair else item.text
             for item in items]  # fmt: skip
    answer = await engine.classify(pairs, body.parameters, watch_disconnect(request), documents)
    # One list of labels per input, for one input too: [[{label, score}, …]], as the Inference API answers
    # (InferenceClient.text_classification reads the first list).
    return Answered(answer.content, headers=answer.headers(started))


CLASSIFY_EXAMPLES = {
    "text": {"value": {"inputs": "the dog ran in the park", "parameters": {"top_k": 3}}},
    "pair": {"value": {"inputs": {"text": "is it sunny?", "text_pair": "yes it is."}}},
    "list": {"value": {"inputs": ["a bird", "the tree under a blue sky"], "parameters": {"truncate": True}}},
}


@api.post(
    "/classify",
    summary="Classify texts or text pairs (Hugging Face text-classification format)",
    description="One list of `{label, score}` per input, highest score first: `[[…]]` for one input too, "
    "as the Inference API and `InferenceClient.text_classification` have it.",
    response_model=list[list[LabelScore]],
    openapi_extra=body_examples(CLASSIFY_EXAMPLES),
)
async def classify(body: ClassifyRequest, request: Request):
    return await _classify(body, request, documents=False)


@api.post(
    "/documents/classify",
    summary="Classify whole documents up to the model's maximum length (its longest bucket) in one forward pass",
    response_model=list[list[LabelScore]],
    openapi_extra=body_examples(
        {"document": {"value": {"inputs": {"text": "a long report …", "text_pair": "is it about sport?"}}}}
    ),
)
async def classify_documents(body: DocumentClassifyRequest, request: Request):
    return await _classify(body, request, documents=True)


@api.post(
    "/embed",
    summary="Mean-pooled embeddings",
    response_model=EmbedResponse,
    openapi_extra=body_examples({"texts": {"value": {"inputs": ["the cat sat", "a dog ran"]}}}),
)
async def embed(body: EmbedRequest, request: Request):
    started = time.perf_counter()
    engine = service(request).engine_for(body.model, "embeddings")
    texts, many = as_list(body.inputs)
    answer = await engine.embed(texts, body.parameters, watch_disconnect(request))
    vectors = answer.content if many else answer.content[:1]
    content = {"embeddings": vectors, "dimensions": len(vectors[0])}
    return Answered(content, headers=answer.headers(started))


@api.post(
    "/embeddings",
    summary="Embeddings (OpenAI format)",
    description="OpenAI's `POST /v1/embeddings`: `input` a text, texts, token ids of this model's vocabulary "
    "(as /tokenize gives them, the whole input: [CLS] and [SEP] included) or lists of them; `encoding_format` "
    "float or base64 (little-endian float32); vectors are L2-normalised. `dimensions`: only the model's own "
    "size (the embeddings are not trained to be shortened; another size is 400). A text longer than the model "
    'is 413 unless `overflow` (this service\'s field, beside OpenAI\'s) is "truncate" or "chunk" (overlapping '
    "windows, pooled; the x-windows header); token ids are never cut.",
    response_model=OpenAIEmbeddingsResponse,
    tags=["OpenAI"],
)
async def openai_embeddings(body: OpenAIEmbeddingsRequest, request: Request):
    started = time.perf_counter()
    engine = service(request).engine_for(body.model, "embeddings")
    inputs = body.input
    items = [inputs] if isinstance(inputs, str) or isinstance(inputs[0], int) else list(inputs)
    params = EmbedParameters(overflow=body.overflow, prompt_name=body.prompt_name)
    answer = await engine.embed(items, params, watch_disconnect(request), body.dimensions)
    if body.encoding_format == "base64":
        vectors = [base64.b64encode(np.asarray(v, "<f4").tobytes()).decode("ascii") for v in answer.content]
    else:
        vectors = answer.content
    content = {
        "object": "list",
        "data": [{"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(vectors)],
        "model": engine.name,
        "usage": {"prompt_tokens": answer.tokens, "total_tokens": answer.tokens},
    }
    return Answered(content, headers=answer.headers(started))


QA_DESCRIPTION = """Extractive question answering, Hugging Face's format: `inputs` one `{question, context}` or a
list; per input the best answer `{answer, score, start, end}` (`start`/`end`: characters of the context), or
a list of `top_k` of them.

The context is read whole, in ONE forward pass, up to the model's longest bucket (4,096 tokens for the long
models): no 384-token windows with a stride. Tokenized as a pair, question first (as transformers does);
longer than the model is 413 unless `truncate`, which cuts the context and never the question. Spans are
scored as transformers' question-answering pipeline scores them: softmax over the context's start and end
logits, spans of at most `max_answer_len` tokens widened to whole words; with `handle_impossible_answer`
the no-answer ([CLS]) competes and answers `{answer: "", start: 0, end: 0}`."""


@api.post(
    "/question-answering",
    summary="Answer questions from a context of up to the model's maximum length (Hugging Face format)",
    description=QA_DESCRIPTION,
    responses={200: {"model": QuestionAnswer | list[QuestionAnswer] | list[QuestionAnswer | list[QuestionAnswer]]}},
    openapi_extra=body_examples(
        {
            "one": {
                "value": {"inputs": {"question": "When was it built?", "context": "The lighthouse was built in 1874."}}
            },
            "top_k": {
                "value": {
                    "inputs": {"question": "Who founded the club?", "context": "Ada Brennan founded it in 1952."},
                    "parameters": {"top_k": 3, "max_answer_len": 10, "handle_impossible_answer": True},
                }
            },
        }
    ),
)
async def question_answering(body: QuestionAnsweringRequest, request: Request):
    started = time.perf_counter()
    engine = service(request).engine_for(body.model, "question-answering")
    items, many = as_list(body.inputs)
    answer = await engine.question_answering(
        [(item.question, item.context) for item in items], body.parameters, watch_disconnect(request)
    )
    # transformers' shape: one answer as an object, several as a list
    answer.content = [spans[0] if len(spans) == 1 else spans for spans in answer.content]
    return respond(answer, many, started)


TOKENS_DESCRIPTION = """Token classification (named entities, tags), Hugging Face's format: per input a list of
`{entity, score, index, word, start, end}` per token (`aggregation_strategy` none), or of
`{entity_group, score, word, start, end}` per group of tokens (simple, first, average, max), exactly as
transformers' token-classification pipeline; `start`/`end` are characters of the input. Labels in
`ignore_labels` (default `["O"]`) are left out. A list of inputs answers a list of lists. Inputs up to the
model's longest bucket in one pass; longer is 413 unless `truncate`."""


@api.post(
    "/token-classification",
    summary="Label every token or entity of texts (Hugging Face token-classification format)",
    description=TOKENS_DESCRIPTION,
    responses={200: {"model": list[TokenEntity] | list[list[TokenEntity]]}},
    openapi_extra=body_examples(
        {
            "simple": {
                "value": {
                    "inputs": "Ada Brennan founded the club in Millbay.",
                    "parameters": {"aggregation_strategy": "simple"},
                }
            },
            "tokens": {"value": {"inputs": ["Maria works in Lisbon."], "parameters": {"ignore_labels": []}}},
        }
    ),
)
async def token_classification(body: TokenClassificationRequest, request: Request):
    started = time.perf_counter()
    engine = service(request).engine_for(body.model, "token-classification")
    texts, many = as_list(body.inputs)
    answer = await engine.token_classification(texts, body.parameters, watch_disconnect(request))
    return respond(answer, many, started)


@api.get(
    "/models",
    response_model=ModelsResponse,
    response_model_exclude_none=True,
    summary="Models served (OpenAI list format), with their tasks, labels and buckets",
    description="`{object: list, data: [{id, object: model, created, owned_by, status, tasks, labels, "
    "max_length, buckets, runtime}]}`; with skip_failed_models a model that failed to load is listed with "
    "`status: failed` and its `error`.",
    tags=["OpenAI"],
)
async def list_models(request: Request):
    state = service(request)
    cards = [engine.card() for engine in state.models.values()]
    cards += [ModelCard(id=name, created=state.created, status="failed", error=reason)
              for name, reason in state.failed.items()]  # fmt: skip
    return ModelsResponse(data=cards)


# -- text-embeddings-inference routes ----------------------------------------------------------
# Same JSON as huggingface/text-embeddings-inference. Which served model answers (ServiceState.engine_for):
# /embed a dedicated embedding model if one is served, else the first with embeddings; /predict the
# first with classification; /rerank see below; /tokenize, /decode, /info and POST / the first served
# model (the default model).


@tei.post("/embed", summary="Embeddings (TEI)", response_model=list[list[float]])
async def tei_embed(body: TEIEmbedRequest, request: Request):
    engine = service(request).engine_for(None, "embeddings")
    return await _tei_embed(engine, body, request)


async def _tei_embed(engine, body: TEIEmbedRequest, request: Request) -> JSONResponse:
    started = time.perf_counter()
    items, _ = tei_items(body.inputs)
    params = EmbedParameters(normalize=body.normalize, overflow=body.overflow, prompt_name=body.prompt_name)
    answer = await engine.embed(items, params, watch_disconnect(request), body.dimensions)
    return Answered(answer.content, headers=answer.headers(started))  # one vector per input, always


@tei.post(
    "/predict",
    summary="Classify a text, a pair or a batch (TEI)",
    description="A text or a pair `[text, text_pair]` gets a list of `{label, score}`, a batch a list of them. "
    "`raw_scores`: the logits instead of softmax / sigmoid scores.",
    response_model=list[LabelScore] | list[list[LabelScore]],
)
async def tei_predict(body: TEIPredictRequest, request: Request):
    engine = service(request).engine_for(None, "classification")
    return await _tei_predict(engine, body, request)


async def _tei_predict(engine, body: TEIPredictRequest, request: Request) -> JSONResponse:
    started = time.perf_counter()
    inputs = body.inputs
    one = isinstance(inputs, str) or isinstance(inputs[0], str)  # a text, or one pair
    items = [inputs] if one else inputs
    pairs = [item if isinstance(item, str) else item[0] if len(item) == 1 else (item[0], item[1]) for item in items]
    params = ClassifyParameters(function_to_apply="none" if body.raw_scores else None, overflow=body.overflow)
    answer = await engine.classify(pairs, params, watch_disconnect(request))
    return respond(answer, not one, started)


@tei.post(
    "/rerank",
    summary="Rank texts against a query (TEI)",
    description="`[{index, score, text?}]`, highest score first. Scoring: where a classifier with a single "
    "label is served (a reranker), it cross-scores each (query, text) pair: the sigmoid of its logit, or the "
    "logit with `raw_scores`. Otherwise the cosine similarity of the query's and each text's mean-pooled, "
    "L2-normalised embedding from a served embedding model, else from the first served model with embeddings "
    "(`raw_scores` changes nothing).",
    response_model=list[TEIRank],
    response_model_exclude_none=True,
)
async def tei_rerank(body: TEIRerankRequest, request: Request):
    started = time.perf_counter()
    engine, cross = service(request).reranker()
    scores, answer = await engine.rerank(
        body.query, body.texts, cross, body.raw_scores, body.truncating, watch_disconnect(request)
    )
    order = sorted(range(len(scores)), key=lambda i: -scores[i])
    ranks = [{"index": i, "score": scores[i], **({"text": body.texts[i]} if body.return_text else {})} for i in order]
    return Answered(ranks, headers=answer.headers(started))


@tei.post(
    "/similarity",
    summary="Cosine similarity of a sentence to others (TEI)",
    description="`{inputs: {source_sentence, sentences}, parameters?: {truncate, prompt_name}}` → one cosine "
    "similarity per sentence, in their order, of the mean-pooled, L2-normalised embeddings from the model "
    "`/embed` uses (the Inference API's sentence-similarity: `InferenceClient.sentence_similarity`).",
    response_model=list[float],
)
async def tei_similarity(body: TEISimilarityRequest, request: Request):
    started = time.perf_counter()
    engine = service(request).engine_for(None, "embeddings")
    given = body.parameters or TEISimilarityParameters()
    params = EmbedParameters(truncate=given.truncating, prompt_name=given.prompt_name)
    scores, answer = await engine.similarity(
        body.inputs.source_sentence, body.inputs.sentences, params, watch_disconnect(request)
    )
    return Answered(scores, headers=answer.headers(started))


@tei.post(
    "/embed_all",
    summary="A vector per token (TEI)",
    description="Per input, the last hidden state at each of its tokens ([CLS] and [SEP] included): what the "
    "embeddings pool, before the pooling, the Dense and the normalisation. From the dedicated embedding model "
    "(BiGSModel); 400 where none is served. Longer than the model is 413 unless `truncate`; at most "
    "`max_token_embeddings` tokens a request (413 past them).",
    response_model=list[list[list[float]]],
)
async def tei_embed_all(body: TEIEmbedAllRequest, request: Request):
    started = time.perf_counter()
    engine = service(request).engine_for(None, "token-embeddings")
    items, _ = tei_items(body.inputs)
    answer = await engine.token_embeddings(items, body.truncating, body.prompt_name, watch_disconnect(request))
    return Written(answer.content, headers=answer.headers(started))


@tei.post(
    "/tokenize",
    summary="Tokenize texts (TEI)",
    description="Per text, its tokens `{id, text, special, start, stop}`. Texts are bounded as the model's "
    "inputs are: at most `max_inputs_per_request` of them, each up to the model's maximum length; longer is "
    "413 unless `truncate`, which cuts it there (TEI's /tokenize has no bound but the body's).",
    response_model=list[list[TEIToken]],
)
async def tei_tokenize(body: TEITokenizeRequest, request: Request):
    texts, _ = tei_items(body.inputs)
    engine = service(request).default_engine()
    return Written(await engine.tokenize(texts, body.add_special_tokens, body.truncating, body.prompt_name))


@tei.post(
    "/decode",
    summary="Decode token ids (TEI)",
    description="Per list of token ids, its text. Each list is a model input's ids: at most the model's "
    "maximum length (413 past it), ids of its vocabulary (422 otherwise).",
    response_model=list[str],
)
async def tei_decode(body: TEIDecodeRequest, request: Request):
    sequences = [body.ids] if isinstance(body.ids[0], int) else body.ids
    return Written(await service(request).default_engine().decode(sequences, body.skip_special_tokens))


# TEI's words for the precision served. TEI's `model_dtype` is one dtype: a model served at several
# precisions (auto, per bucket) gives the precision of most of its buckets; /v1/models has them all.
MODEL_DTYPE = {name: spec.tei_dtype for name, spec in PRECISIONS.items()}


@tei.get("/info", summary="The default model and the service's limits (TEI)", response_model=TEIInfo,
         response_model_exclude_none=True)  # fmt: skip
async def tei_info(request: Request):
    state = service(request)
    engine = state.default_engine()
    settings = state.settings
    if "classification" in engine.heads:
        labels = {str(i): label for i, label in sorted(engine.id2label.items())}
        classifier = {"id2label": labels, "label2id": {label: int(i) for i, label in labels.items()}}
        model_type = {"reranker" if len(labels) == 1 else "classifier": classifier}
    else:
        model_type = {"embedding": {"pooling": "mean"}}
    return {
        "model_id": engine.name,
        "model_dtype": MODEL_DTYPE[dominant_precision(engine.runtime.precisions)],
        "model_type": model_type,
        "max_concurrent_requests": settings.max_in_flight,
        "max_input_length": engine.max_length,
        "max_batch_tokens": settings.max_batch_tokens,
        "max_batch_requests": settings.max_batch_size,
        "max_client_batch_size": settings.max_inputs_per_request,
        "auto_truncate": False,
        "tokenization_workers": 1,
        "version": VERSION,
    }


@tei.post(
    "/",
    summary="The default model's task (TEI)",
    description="The first served model's task: /predict's request and answer when it classifies, else /embed's.",
    response_model=list[list[float]] | list[LabelScore] | list[list[LabelScore]],
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {
                    "schema": {
                        "oneOf": [
                            {"$ref": "#/components/schemas/TEIEmbedRequest"},
                            {"$ref": "#/components/schemas/TEIPredictRequest"},
                        ]
                    }
                }
            },
        }
    },
)
async def tei_default(request: Request):
    engine = service(request).default_engine()
    content_type = request.headers.get("content-type", "")
    if "json" not in content_type:
        message = f"send the body as JSON with Content-Type: application/json (got {content_type or 'none'!r})"
        raise ServiceError(415, "unsupported_media_type", message)
    try:
        body = await request.json()
    except (ValueError, RecursionError):  # not JSON, or nested deeper than the decoder goes
        raise ServiceError(422, "validation", "the body is not valid JSON") from None
    if "classification" in engine.heads:
        return await _tei_predict(engine, validated(TEIPredictRequest, body), request)
    return await _tei_embed(engine, validated(TEIEmbedRequest, body), request)


class Health(BaseModel):
    status: str


class Ready(BaseModel):
    status: str
    models: list[str]
    failed: dict[str, str] | None = None


@ops.get("/health", summary="Liveness: the process answers", response_model=Health)
async def health():
    return {"status": "ok"}


@ops.get(
    "/ready",
    summary="Readiness: models loaded and every batch shape warmed up",
    response_model=Ready,
    response_model_exclude_none=True,
    responses={503: {"model": ErrorBody, "description": "loading, warming up or shutting down"}},
)
async def ready(request: Request):
    state = service(request)
    if not state.ready:
        detail = state.load_error or ("shutting down" if state.stopping else "loading and warming up")
        return error_response(503, "not_ready", detail)
    if state.failed:  # skip_failed_models: the others are served
        return {"status": "ready", "models": list(state.models), "failed": state.failed}
    return {"status": "ready", "models": list(state.models)}


@ops.get(
    "/metrics",
    summary="Prometheus metrics",
    dependencies=[bearer],
    response_class=PlainTextResponse,
    responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}}},
)
async def metrics(request: Request):
    return Response(service(request).metrics.exposition(), media_type="text/plain; version=0.0.4")


@ops.get("/", include_in_schema=False)  # POST / is TEI's default route
async def root():
    return PlainTextResponse("BiGS serving: see /docs\n")
