"""HTTP routes. Each follows the request path: validate → admit → tokenize → queue → wait → answer.

Waiting watches the client and the deadline: a request whose client has gone, or whose deadline
has passed, cancels its queued inputs so they are dropped before they cost compute.
"""

from __future__ import annotations

import asyncio
import time

import numpy as np
from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from .batcher import DeadlineExceeded, Job, RuntimeFailure
from .errors import ServiceError
from .models import ServedModel, timings_of
from .postprocess import classification_scores, default_function, fill_mask_candidates, l2_normalize
from .schemas import (
    ClassifyRequest,
    DocumentClassifyRequest,
    EmbedRequest,
    ErrorBody,
    FillMaskRequest,
    ModelsResponse,
)
from .tokenization import TooLong

ERRORS = {code: {"model": ErrorBody} for code in (400, 401, 413, 422, 429, 500, 503, 504)}


def service(request: Request):
    return request.app.state.service


def require_api_key(request: Request) -> None:
    key = request.app.state.service.settings.api_key
    if key and request.headers.get("authorization") != f"Bearer {key}":
        raise ServiceError(401, "unauthorized", "missing or wrong API key (Authorization: Bearer <key>)")


api = APIRouter(prefix="/v1", dependencies=[Depends(require_api_key)], responses=ERRORS)
ops = APIRouter()


# -- helpers along the request path --------------------------------------------------------


def as_list(inputs) -> tuple[list, bool]:
    return (inputs, True) if isinstance(inputs, list) else ([inputs], False)


class Admission:
    """A bound on requests in flight: past it, 429 with Retry-After instead of an unbounded queue."""

    def __init__(self, state):
        self.state = state

    async def __aenter__(self):
        state = self.state
        if not state.ready:
            raise ServiceError(503, "not_ready", "the service is starting or shutting down", {"Retry-After": "1"})
        if state.in_flight >= state.settings.max_in_flight:
            state.metrics.rejected.inc()
            raise ServiceError(429, "overloaded", "too many requests in flight; retry shortly", {"Retry-After": "1"})
        state.in_flight += 1
        state.metrics.in_flight.set(state.in_flight)

    async def __aexit__(self, *_):
        self.state.in_flight -= 1
        self.state.metrics.in_flight.set(self.state.in_flight)


def check_count(state, items: list) -> None:
    limit = state.settings.max_inputs_per_request
    if len(items) > limit:
        raise ServiceError(422, "validation", f"{len(items)} inputs in one request; at most {limit}")


async def tokenize(model: ServedModel, items: list, truncate: bool = False, documents: bool = False, limit=None):
    """`limit` (below the model's max length): the most tokens this endpoint takes; `truncate` cuts there."""
    try:
        with model.batcher.expecting():  # the caller queues the result with no await in between
            return await asyncio.to_thread(model.tokenizer.encode, items, truncate, documents, limit)
    except TooLong as error:
        if limit is None or limit >= model.max_length:
            raise ServiceError(413, "too_long", str(error)) from None
        raise ServiceError(
            413,
            "too_long",
            f"input {error.index} has {error.length} tokens; /v1/classify takes at most {limit} "
            "(use /v1/documents/classify for long documents, or set truncate)",
        ) from None


async def client_gone(request: Request) -> None:
    """Returns when the client disconnects: the body has been read, so the next ASGI message the
    server has for this request is `http.disconnect` (event-driven, nothing polled)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def wait_for(request: Request, jobs: list[Job], deadline: float) -> list[np.ndarray]:
    futures = [job.future for job in jobs]
    gone = asyncio.ensure_future(client_gone(request))
    try:
        pending = set(futures)
        while pending:
            remaining = deadline - time.perf_counter()
            if remaining <= 0:
                raise ServiceError(504, "timeout", "the request deadline passed before it was answered")
            await asyncio.wait(pending | {gone}, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
            if gone.done():
                raise ServiceError(499, "client_closed", "the client went away")
            pending = {f for f in pending if not f.done()}
        return [f.result() for f in futures]
    except DeadlineExceeded as error:
        raise ServiceError(504, "timeout", str(error)) from None
    except RuntimeFailure as error:
        raise ServiceError(500, "runtime_error", f"the model failed on this batch: {error}") from None
    finally:
        gone.cancel()
        for future in futures:  # whatever is still queued is dropped, not computed
            future.cancel()


def deadline_of(state) -> float:
    return time.perf_counter() + state.settings.request_timeout_s


def answer(content, jobs: list[Job], started: float) -> JSONResponse:
    return JSONResponse(content, headers=timings_of(jobs, started))


# -- endpoints ------------------------------------------------------------------------------


@api.post("/fill-mask", summary="Fill [MASK] tokens (Hugging Face fill-mask format)")
async def fill_mask(body: FillMaskRequest, request: Request):
    started = time.perf_counter()
    state = service(request)
    model = state.model_for(body.model, "fill-mask")
    texts, many = as_list(body.inputs)
    check_count(state, texts)
    async with Admission(state):
        encoded = await tokenize(model, texts)
        positions = []
        for i, enc in enumerate(encoded):
            found = np.flatnonzero(enc.input_ids == model.tokenizer.mask_token_id)
            if not len(found):
                raise ServiceError(422, "validation", f"input {i} has no [MASK] token")
            if len(found) > state.settings.max_masks_per_input:
                limit = state.settings.max_masks_per_input
                raise ServiceError(422, "validation", f"input {i} has {len(found)} [MASK] tokens; at most {limit}")
            positions.append(found)
        targets = body.parameters.targets
        target_ids = None
        if targets is not None:
            words = [targets] if isinstance(targets, str) else targets
            if not words:
                raise ServiceError(422, "validation", "targets is an empty list")
            try:
                target_ids = model.tokenizer.token_ids(words)
            except ValueError as error:
                raise ServiceError(422, "validation", str(error)) from None
        jobs = model.submit("fill-mask", encoded, deadline_of(state), positions)
        outputs = await wait_for(request, jobs, jobs[0].deadline)
    results = []
    for enc, found, logits in zip(encoded, positions, outputs, strict=True):
        per_mask = [
            fill_mask_candidates(
                logits[m], enc.input_ids, int(pos), model.tokenizer, body.parameters.top_k, target_ids, len(found) == 1
            )
            for m, pos in enumerate(found)
        ]
        results.append(per_mask[0] if len(per_mask) == 1 else per_mask)
    return answer(results if many else results[0], jobs, started)


async def _classify(body: ClassifyRequest, request: Request, documents: bool):
    started = time.perf_counter()
    state = service(request)
    model = state.model_for(body.model, "classification")
    items, many = as_list(body.inputs)
    check_count(state, items)
    pairs = [item if isinstance(item, str) else (item.text, item.text_pair) if item.text_pair else item.text
             for item in items]  # fmt: skip
    params = body.parameters
    limit = None if documents else min(state.settings.classify_max_length, model.max_length)
    async with Admission(state):
        encoded = await tokenize(model, pairs, params.truncate, documents, limit)
        jobs = model.submit("classification", encoded, deadline_of(state))
        outputs = await wait_for(request, jobs, jobs[0].deadline)
    function = params.function_to_apply or default_function(model.problem_type, len(model.id2label))
    results = [classification_scores(logits, model.id2label, function, params.top_k) for logits in outputs]
    return answer(results if many else results[0], jobs, started)


@api.post("/classify", summary="Classify texts or text pairs (Hugging Face text-classification format)")
async def classify(body: ClassifyRequest, request: Request):
    return await _classify(body, request, documents=False)


@api.post(
    "/documents/classify",
    summary="Classify whole documents up to the model's maximum length (4,096 tokens) in one forward pass",
)
async def classify_documents(body: DocumentClassifyRequest, request: Request):
    return await _classify(body, request, documents=True)


@api.post("/embed", summary="Mean-pooled embeddings")
async def embed(body: EmbedRequest, request: Request):
    started = time.perf_counter()
    state = service(request)
    model = state.model_for(body.model, "embeddings")
    texts, many = as_list(body.inputs)
    check_count(state, texts)
    async with Admission(state):
        encoded = await tokenize(model, texts, body.parameters.truncate)
        jobs = model.submit("embeddings", encoded, deadline_of(state))
        outputs = await wait_for(request, jobs, jobs[0].deadline)
    vectors = np.stack(outputs)
    if body.parameters.normalize:
        vectors = l2_normalize(vectors)
    content = {"embeddings": vectors.tolist(), "dimensions": int(vectors.shape[1])}
    if not many:
        content["embeddings"] = content["embeddings"][:1]
    return answer(content, jobs, started)


@api.get("/models", response_model=ModelsResponse, summary="Models served, their tasks, labels and buckets")
async def list_models(request: Request):
    return {"models": [m.card() for m in service(request).models.values()]}


@ops.get("/health", summary="Liveness: the process answers")
async def health():
    return {"status": "ok"}


@ops.get("/ready", summary="Readiness: models loaded and every batch shape warmed up")
async def ready(request: Request):
    state = service(request)
    if not state.ready:
        detail = state.load_error or ("shutting down" if state.stopping else "loading and warming up")
        return JSONResponse({"error": detail, "error_type": "not_ready"}, status_code=503)
    return {"status": "ready", "models": list(state.models)}


@ops.get("/metrics", summary="Prometheus metrics")
async def metrics(request: Request):
    return Response(service(request).metrics.exposition(), media_type="text/plain; version=0.0.4")


@ops.get("/", include_in_schema=False)
async def root():
    return PlainTextResponse("BiGS serving: see /docs\n")
