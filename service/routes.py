"""HTTP routes. A handler validates (the pydantic body), picks the model's engine, calls it once
and shapes the answer in the wire format; the request's path between those lives in the engine
(service/engine.py): admit → encode → submit → await → postprocess.
"""

from __future__ import annotations

import time

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from .engine import Answer
from .schemas import (
    ClassifyRequest,
    DocumentClassifyRequest,
    EmbedRequest,
    EmbedResponse,
    ErrorBody,
    FillMaskCandidate,
    FillMaskRequest,
    LabelScore,
    ModelsResponse,
)
from .state import ServiceState

FillMaskAnswer = list[FillMaskCandidate] | list[list[FillMaskCandidate]]
ERRORS = {code: {"model": ErrorBody} for code in (400, 401, 413, 422, 429, 500, 503, 504)}


def service(request: Request) -> ServiceState:
    return request.app.state.service


# The API key is checked by the ApiKey middleware (service/app.py), before the body is read, on every
# path but `open_paths` (/health, /ready): /v1/*, /metrics, /docs and /openapi.json alike.
api = APIRouter(prefix="/v1", responses=ERRORS)
ops = APIRouter()


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


def respond(answer: Answer, many: bool, started: float) -> JSONResponse:
    return JSONResponse(answer.content if many else answer.content[0], headers=answer.headers(started))


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
    items, many = as_list(body.inputs)
    pairs = [item if isinstance(item, str) else (item.text, item.text_pair) if item.text_pair else item.text
             for item in items]  # fmt: skip
    answer = await engine.classify(pairs, body.parameters, watch_disconnect(request), documents)
    return respond(answer, many, started)


@api.post(
    "/classify",
    summary="Classify texts or text pairs (Hugging Face text-classification format)",
    responses={200: {"model": list[LabelScore] | list[list[LabelScore]]}},
)
async def classify(body: ClassifyRequest, request: Request):
    return await _classify(body, request, documents=False)


@api.post(
    "/documents/classify",
    summary="Classify whole documents up to the model's maximum length (4,096 tokens) in one forward pass",
    responses={200: {"model": list[LabelScore] | list[list[LabelScore]]}},
)
async def classify_documents(body: DocumentClassifyRequest, request: Request):
    return await _classify(body, request, documents=True)


@api.post("/embed", summary="Mean-pooled embeddings", responses={200: {"model": EmbedResponse}})
async def embed(body: EmbedRequest, request: Request):
    started = time.perf_counter()
    engine = service(request).engine_for(body.model, "embeddings")
    texts, many = as_list(body.inputs)
    answer = await engine.embed(texts, body.parameters, watch_disconnect(request))
    vectors = answer.content if many else answer.content[:1]
    content = {"embeddings": vectors, "dimensions": len(vectors[0])}
    return JSONResponse(content, headers=answer.headers(started))


@api.get("/models", response_model=ModelsResponse, summary="Models served, their tasks, labels and buckets")
async def list_models(request: Request):
    state = service(request)
    listing = ModelsResponse(models=[engine.card() for engine in state.models.values()])
    if not state.failed:
        return listing
    failed = [{"name": name, "status": "failed", "error": reason} for name, reason in state.failed.items()]
    return JSONResponse({**listing.model_dump(mode="json"), "failed": failed})  # skip_failed_models


@ops.get("/health", summary="Liveness: the process answers")
async def health():
    return {"status": "ok"}


@ops.get("/ready", summary="Readiness: models loaded and every batch shape warmed up")
async def ready(request: Request):
    state = service(request)
    if not state.ready:
        detail = state.load_error or ("shutting down" if state.stopping else "loading and warming up")
        return JSONResponse({"error": detail, "error_type": "not_ready"}, status_code=503)
    if state.failed:  # skip_failed_models: the others are served
        return {"status": "ready", "models": list(state.models), "failed": state.failed}
    return {"status": "ready", "models": list(state.models)}


@ops.get("/metrics", summary="Prometheus metrics")
async def metrics(request: Request):
    return Response(service(request).metrics.exposition(), media_type="text/plain; version=0.0.4")


@ops.get("/", include_in_schema=False)
async def root():
    return PlainTextResponse("BiGS serving: see /docs\n")
