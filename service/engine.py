"""The inference facade: one `ModelEngine` per served model, the middle of every request's path.

A route handler validates the body, asks the service state for the engine, calls ONE method of it
(`fill_mask`, `classify`, `embed`, `question_answering`, `token_classification`; `rerank`, built on
`classify` or `embed`; `tokenize` and `decode`, the model's tokenizer alone) and shapes the answer.
Everything between lives here, in the order a request meets it:

    (admitted)   the request already holds a permit of the service-wide bound on requests in
                 flight, taken before its body was parsed (service/admission.py)
    encode       the model's tokenizer, in a worker thread (service/tokenization.py); meanwhile the
                 batcher knows more inputs are on their way (service/batcher.py waits only for those)
    admit tokens the padded token positions it will cost, against the service-wide bound on tokens
                 in flight in each lane (else 429, Retry-After)
    submit       one job per input onto the (head, bucket) queues of the batcher (service/buckets.py)
    await        the jobs' futures, watching the request's deadline (504) and the client's disconnect
                 (its queued inputs are then dropped before they cost compute)
    postprocess  logits → scores and candidates, pooled vectors → embeddings (service/postprocess.py);
                 a large fill-mask answer in a worker thread

The request's deadline (`request_timeout_s`) starts when the engine method is entered, and covers
the tokenization too. Every method, `tokenize` and `decode` included, takes the same per-request
bounds: `max_inputs_per_request` inputs, each at most the model's length (413 past it unless
`truncate`; a text far over it counted from a prefix, service/tokenization.py; embeddings and
classification may instead read it in windows, `"overflow": "chunk"`, service/chunking.py), tokenized
under the deadline (`_tokenizer_work`): on the loop when the request's texts are short and a batch is
running (under load a worker thread's hand-off costs more CPU than tokenizing ~125 tokens, CPU the graph
needs), else in a worker thread, where the request counts as on its way and an idle lane waits for it to
batch (batcher.py). Nothing a request sends is worked on at length on the event loop: CPU work that grows
with the request runs in worker threads (large answers are built there too), and fill-mask answers are
bounded (`max_fill_mask_candidates`).

An engine is built from an export dir's manifest, read once by the service state (service/state.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import numpy as np
import pydantic_core

from export.manifest import Manifest
from export.precisions import FP32

from .admission import Admission
from .batcher import DeadlineExceeded, Job, ModelBatcher, RuntimeFailure, lane_name
from .buckets import bucket_for
from .chunking import WindowPolicy, Windows, split_into_windows
from .errors import ServiceError
from .metrics import ServiceMetrics
from .postprocess import (
    classification_scores,
    default_function,
    fill_mask_candidates,
    l2_normalize,
    question_answers,
    token_entities,
)
from .precision_policy import PrecisionChoice, precision_for_model
from .prompts import Prompts
from .runtimes import Runtime, load_runtime
from .schemas import (
    ClassifyParameters,
    EmbedParameters,
    FillMaskParameters,
    ModelCard,
    QuestionAnsweringParameters,
    TokenClassificationParameters,
)
from .settings import ServiceSettings
from .telemetry import current as current_request
from .telemetry import note_model
from .tokenization import Encoded, RequestTokenizer, SpanEncoded, TooLong

# Postprocessing more than this (masks × vocabulary softmax entries, plus candidates × input tokens for
# their sequences) runs in a worker thread; smaller answers are quicker done on the loop than handed off.
POSTPROCESS_INLINE_WORK = 200_000
# While a batch runs, a request whose texts come to at most this many characters (token ids count one each) is
# tokenized on the loop: ~1 ms of WordPiece on a slow core, less than what handing it to a worker thread and back
# costs the loop and that thread together, and its inputs queue for the next batch either way. At 32 clients
# sending ~125-token texts (2-core Xeon, VNNI) that CPU went to the graph: 12.1 vs 13.7 ms of server CPU a
# request, 122 vs 108 requests/s (docs/BENCHMARKS.md, "Where a request's time goes"). With the lane idle the
# thread is kept: a request being tokenized there is one the lane waits for (batcher.py), which is what forms
# batches of cheap requests.
TOKENIZE_INLINE_CHARS = 4_096

T = TypeVar("T")
log = logging.getLogger("bigs")

# Returns when the client has gone away (the route knows how to tell; the engine watches for it).
ClientGone = Callable[[], Awaitable[None]]


@dataclass
class Answer:
    """What an engine answers one request with: the content per input (or that list already written as
    JSON, where writing it is work for a worker thread), and where the time went."""

    content: list | bytes
    jobs: list[Job]
    windows: Windows | None = None  # the inputs were read in windows ("overflow": "chunk")

    @property
    def tokens(self) -> int:
        """The inputs' tokens, special tokens included, padding not (OpenAI's `usage.prompt_tokens`)."""
        return sum(job.encoded.length for job in self.jobs)

    def headers(self, started: float) -> dict[str, str]:
        """The slowest input's queue and inference time, the total since `started`, tokens computed."""
        headers = {
            "x-queue-time": f"{max(j.queue_s for j in self.jobs) * 1000:.2f}",
            "x-inference-time": f"{max(j.inference_s for j in self.jobs) * 1000:.2f}",
            "x-total-time": f"{(time.perf_counter() - started) * 1000:.2f}",
            "x-compute-tokens": str(sum(j.compute_tokens for j in self.jobs)),
        }
        if self.windows is not None:  # per input, the windows it was read in
            headers["x-windows"] = self.windows.header
        return headers


class ModelEngine:
    """One served model: its tokenizer, runtime and batcher, and the request path through them."""

    def __init__(
        self,
        name: str,
        export_dir: str | Path,
        manifest: Manifest,
        settings: ServiceSettings,
        metrics: ServiceMetrics,
        admission: Admission,
        runtime: str | None = None,
    ):
        """`runtime`: what runs the model, default the settings'; "torch" for an artifact dir served while
        its export is written (service/preparation.py), which then `switch_to`s the export."""
        self.name = name
        self.export_dir = Path(export_dir)
        self.manifest = manifest
        self.settings = settings
        self.admission = admission
        self._tokenization_time = metrics.tokenization.labels(name)
        self._input_tokens = metrics.input_tokens.labels(name)
        self.heads: list[str] = list(manifest.heads)
        self.buckets: list[int] = sorted(manifest.buckets)
        self.max_length = self.buckets[-1]
        self.id2label = manifest.labels
        self.problem_type = _config_field(self.export_dir, "problem_type")
        self.tokenizer = RequestTokenizer(self.export_dir / "tokenizer.json", self.max_length)
        self.prompts = Prompts.of(self.export_dir)  # sentence-transformers' named prompts, if the dir has them
        kind = runtime or settings.runtime
        if kind == settings.runtime:
            self.precision_choice = self._choose_precision(manifest)
        else:  # the artifact itself, the reference its export is measured against, until the export is done
            self.precision_choice = PrecisionChoice(dict.fromkeys(manifest.buckets, FP32),
                                                    ["the artifact on torch until its export is done"])  # fmt: skip
        # the long lane's buckets compiled as that lane warms them after ready, where a runtime compiles (OpenVINO's)
        compile_later = (
            [b for b in self.buckets if lane_name(b, settings) == "long"] if self._long_lane_after_ready() else []
        )
        self.runtime: Runtime = self._load_runtime(
            kind, self.export_dir, manifest, self.precision_choice, compile_later
        )
        self.batcher = ModelBatcher(name, self.runtime, settings, metrics)
        self.loaded_at = int(time.time())
        self.dimensions = manifest.model.embedding_size  # hidden_size, or the width of the dir's 2_Dense

    def card(self) -> ModelCard:
        return ModelCard(
            id=self.name,
            created=self.loaded_at,
            tasks=self.heads,  # the public API's word for a head
            labels=[self.id2label[i] for i in sorted(self.id2label)] if self.id2label else None,
            max_length=self.max_length,
            positions_tiled_from=self.manifest.model.positions_tiled_from,
            dimensions=self.dimensions if "embeddings" in self.heads else None,
            buckets=self.buckets,
            runtime=self.runtime.kind,
            precision=self.runtime.precision,
            bucket_precisions=self.runtime.precisions,
        )

    # -- lifecycle --------------------------------------------------------------------------

    def warm_up(self, done: Callable[[int, int], object] | None = None) -> int:
        """Run the batcher's warm-up shapes before the service is ready (blocking): every lane's, or the short
        lane's only where the long lane warms its own after (`warmup_long_lane`, `warm_long_lane`); the number of shapes.
        `done(bucket, shapes)` after each bucket (the start-up's progress lines)."""
        self.batcher.warm_up(done, lanes=self._lanes_before_ready())
        return len(self.warm_shapes_before_ready())

    def warm_shapes_before_ready(self) -> list[tuple[str, int, int]]:
        """The (head, bucket, batch) shapes `warm_up` runs before the service is ready."""
        return self.batcher.warm_shapes(lanes=self._lanes_before_ready())

    def _lanes_before_ready(self) -> tuple[str, ...] | None:
        return ("short",) if self._long_lane_after_ready() else None

    def _long_lane_after_ready(self) -> bool:
        return self.settings.warmup and self.settings.warmup_long_lane == "after-ready"

    def start(self) -> None:
        """On the event loop, once loaded: the lanes run."""
        self.batcher.start()

    def warm_long_lane(self) -> None:
        """Once the service has said it is ready (`ServiceState.after_ready`), with `warmup_long_lane` after-ready:
        the long lane warms its buckets first, on its own thread, and says so in one line."""
        if self._long_lane_after_ready():
            warming = self.batcher.warm_long_lane(self._long_lane_warmed)
            if warming is not None:
                warming.add_done_callback(self._long_lane_failed)

    def _long_lane_warmed(self, seconds: float, buckets: list[int]) -> None:
        listed = ", ".join(f"{b:,}" for b in buckets)
        log.info("warm-up %s: the long lane's buckets (%s) warmed after ready in %.1f s", self.name, listed, seconds)

    def _long_lane_failed(self, warming) -> None:
        error = warming.exception()
        if error is not None:  # the lane goes on: its first batches run cold, and fail on their own if they must
            log.warning("warm-up %s: the long lane's warm-up failed (%s: %s)", self.name, type(error).__name__, error)

    def switch_to(self, export_dir: Path, manifest: Manifest) -> str:
        """Blocking (a worker thread, while requests are served): build the export dir's runtime at the
        settings' runtime and precision, warm it up beside the runtime serving now, then send every later
        batch to it; a batch already running ends on the old one. The export must be of the same model
        (same heads and buckets). Returns how the model is served now, in words."""
        if list(manifest.heads) != self.heads or sorted(manifest.buckets) != self.buckets:
            raise ValueError(f"{export_dir} serves {manifest.heads} at {manifest.buckets}, the model "
                             f"{self.heads} at {self.buckets}")  # fmt: skip
        choice = self._choose_precision(manifest)
        runtime = self._load_runtime(self.settings.runtime, Path(export_dir), manifest, choice)
        if self.settings.warmup:
            self.batcher.warm_up(runtime=runtime)
        self.export_dir, self.manifest, self.precision_choice = Path(export_dir), manifest, choice
        # the batcher reads its runtime as each batch is dispatched: one assignment moves every later batch
        self.runtime = self.batcher.runtime = runtime
        return f"{runtime.kind}; {choice.explain()}"

    def _choose_precision(self, manifest: Manifest) -> PrecisionChoice:
        settings = self.settings
        return precision_for_model(settings.precision, settings.runtime, manifest, settings.auto_openvino_buckets,
                                   settings.auto_openvino_min_speedup)  # fmt: skip

    def _load_runtime(
        self,
        kind: str,
        export_dir: Path,
        manifest: Manifest,
        choice: PrecisionChoice,
        compile_later: Collection[int] = (),
    ) -> Runtime:
        settings = self.settings
        return load_runtime(kind, export_dir, manifest, settings.intra_op_threads, settings.ort_spin_wait,
                            settings.ort_shared_arena, choice.by_bucket, settings.cache_dir, compile_later)  # fmt: skip

    async def stop(self) -> None:
        await self.batcher.stop()

    # -- the three requests -----------------------------------------------------------------

    async def fill_mask(self, texts: list[str], params: FillMaskParameters, client_gone: ClientGone) -> Answer:
        """Per text: the candidates of its one [MASK], or a list of them per [MASK] when it has several."""
        note_model(self.name)
        deadline = self._deadline()
        self._check_count(texts)
        target_ids = await self._target_ids(params.targets)
        encoded = await self._encode(texts, deadline=deadline, fill_mask=True)
        positions = [self._mask_positions(i, enc) for i, enc in enumerate(encoded)]
        per_mask = params.top_k if target_ids is None else min(params.top_k, len(target_ids))
        self._check_candidates(positions, per_mask)
        with self._admit_tokens(encoded):
            jobs = self._submit("fill-mask", encoded, deadline, positions)
            outputs = await self._await(jobs, client_gone)
            work = sum(
                len(found) * (self.manifest.model.vocab_size + per_mask * enc.length)
                for enc, found in zip(encoded, positions, strict=True)
            )
            content = await self._postprocess(
                work, self._fill_mask_content, encoded, positions, outputs, params.top_k, target_ids
            )
        return Answer(content, jobs)

    def _fill_mask_content(self, encoded, positions, outputs, top_k, target_ids) -> list:
        content = []
        for enc, found, logits in zip(encoded, positions, outputs, strict=True):
            per_mask = [
                fill_mask_candidates(
                    logits[m], enc.input_ids, int(pos), self.tokenizer, top_k, target_ids, len(found) == 1
                )
                for m, pos in enumerate(found)
            ]
            content.append(per_mask[0] if len(per_mask) == 1 else per_mask)
        return content

    async def classify(
        self,
        items: list[str | tuple[str, str]],
        params: ClassifyParameters,
        client_gone: ClientGone,
        documents: bool = False,
    ) -> Answer:
        """Per text or (text, text_pair): [{"label", "score"}] sorted by score. `documents`: up to the
        model's longest bucket (4,096 for the defaults), truncation cutting the document, never its query;
        otherwise up to `classify_max_length`."""
        note_model(self.name)
        deadline = self._deadline()
        self._check_count(items)
        limit = None if documents else min(self.settings.classify_max_length, self.max_length)
        windows = None
        if params.overflow == "chunk":
            windows = await self._encode_windows(items, limit or self.max_length, deadline)
            encoded = windows.encoded
        else:
            encoded = await self._encode(items, params.truncate, documents, limit, deadline)
        with self._admit_tokens(encoded):
            jobs = self._submit("classification", encoded, deadline)
            outputs = await self._await(jobs, client_gone)
        if windows is not None:
            outputs = windows.pool_logits(outputs)
        function = params.function_to_apply or default_function(self.problem_type, len(self.id2label))
        return Answer(
            [classification_scores(logits, self.id2label, function, params.top_k) for logits in outputs], jobs, windows
        )

    async def embed(
        self,
        texts: list[str | list[int]],
        params: EmbedParameters,
        client_gone: ClientGone,
        dimensions: int | None = None,
    ) -> Answer:
        """Per text (or list of token ids): the mean-pooled embedding, L2-normalised unless asked otherwise.
        `dimensions` (OpenAI, TEI): only the model's own size. Cutting a vector and renormalising it is
        meaningful only for a model trained for it (Matryoshka); these embeddings are not, so another
        size is refused (400) rather than answered with vectors that look right and are not."""
        note_model(self.name)
        if dimensions is not None and dimensions != self.dimensions:
            raise ServiceError(
                400,
                "unsupported_dimensions",
                f"model {self.name!r} gives {self.dimensions}-dimensional embeddings and they are not trained "
                f"to be shortened: ask for dimensions={self.dimensions} or leave dimensions out",
            )
        deadline = self._deadline()
        self._check_count(texts)
        texts = self.prompts.apply(texts, params.prompt_name)
        windows = None
        if params.overflow == "chunk":
            windows = await self._encode_windows(texts, self.max_length, deadline)
            encoded = windows.encoded
        else:
            encoded = await self._encode(texts, params.truncate, deadline=deadline)
        with self._admit_tokens(encoded):
            jobs = self._submit("embeddings", encoded, deadline)
            outputs = await self._await(jobs, client_gone)
        vectors = np.stack(outputs) if windows is None else windows.pool_embeddings(outputs)
        if params.normalize:
            vectors = l2_normalize(vectors)
        return Answer(vectors.tolist(), jobs, windows)

    async def token_embeddings(
        self, texts: list, truncate: bool, prompt_name: str | None, client_gone: ClientGone
    ) -> Answer:
        """Per text (or list of token ids), a vector per token (TEI's /embed_all): the last hidden state at
        each of its tokens, [CLS] and [SEP] included, before the pooling, the Dense and the normalisation the
        embeddings add; as JSON, written in a worker thread where it is large. Bounded beyond the model's
        length: at most `max_token_embeddings` tokens a request (413), each some 9 KB of JSON at 768 wide."""
        note_model(self.name)
        deadline = self._deadline()
        self._check_count(texts)
        texts = self.prompts.apply(texts, prompt_name)
        encoded = await self._encode(texts, truncate, deadline=deadline)
        tokens, limit = sum(enc.length for enc in encoded), self.settings.max_token_embeddings
        if tokens > limit:
            raise ServiceError(
                413, "too_many_tokens", f"{tokens:,} tokens in one request; /embed_all answers at most {limit:,} "
                "(a vector each): send fewer or shorter texts"
            )  # fmt: skip
        with self._admit_tokens(encoded):
            jobs = self._submit("token-embeddings", encoded, deadline)
            outputs = await self._await(jobs, client_gone)
        width = outputs[0].shape[-1]
        content = await self._postprocess(
            tokens * width,
            lambda: pydantic_core.to_json(
                [hidden[: enc.length].tolist() for enc, hidden in zip(encoded, outputs, strict=True)],
                inf_nan_mode="null",
            ),
        )
        return Answer(content, jobs)

    async def question_answering(
        self, items: list[tuple[str, str]], params: QuestionAnsweringParameters, client_gone: ClientGone
    ) -> Answer:
        """Per (question, context): the best `top_k` answer spans of the context, as transformers'
        question-answering pipeline scores them, from ONE forward pass over the whole context (up to the
        model's longest bucket; longer is 413 unless `truncate`, which cuts the context, never the question)."""
        note_model(self.name)
        deadline = self._deadline()
        self._check_count(items)
        encoded = await self._encode_spans(items, params.truncate, "only_second", deadline)
        with self._admit_tokens(encoded):
            jobs = self._submit("question-answering", encoded, deadline)
            outputs = await self._await(jobs, client_gone)
        work = sum(enc.length * params.max_answer_len for enc in encoded)
        content = await self._postprocess(
            work,
            lambda: [
                question_answers(logits, enc, context, params.top_k, params.max_answer_len,
                                 params.handle_impossible_answer)
                for (_, context), enc, logits in zip(items, encoded, outputs, strict=True)
            ],
        )  # fmt: skip
        return Answer(content, jobs)

    async def token_classification(
        self, texts: list[str], params: TokenClassificationParameters, client_gone: ClientGone
    ) -> Answer:
        """Per text: its labelled tokens, words or entities (`aggregation_strategy`), as transformers'
        token-classification pipeline, with character offsets; up to the model's longest bucket in one pass."""
        note_model(self.name)
        deadline = self._deadline()
        self._check_count(texts)
        encoded = await self._encode_spans(texts, params.truncate, "longest_first", deadline)
        with self._admit_tokens(encoded):
            jobs = self._submit("token-classification", encoded, deadline)
            outputs = await self._await(jobs, client_gone)
        work = sum(enc.length * len(self.id2label) for enc in encoded)
        content = await self._postprocess(
            work,
            lambda: [
                token_entities(logits, enc, text, self.id2label, params.aggregation_strategy, params.ignore_labels,
                               self.tokenizer)
                for text, enc, logits in zip(texts, encoded, outputs, strict=True)
            ],
        )  # fmt: skip
        return Answer(content, jobs)

    async def rerank(
        self, query: str, texts: list[str], cross: bool, raw_scores: bool, truncate: bool, client_gone: ClientGone
    ) -> tuple[list[float], Answer]:
        """A score per text for `query`, in the texts' order. `cross`: this model classifies (query, text)
        pairs with one label (a reranker): its sigmoid, or the logit with `raw_scores`. Otherwise the
        cosine similarity of the query's and each text's mean-pooled embedding."""
        if cross:
            function = "none" if raw_scores else "sigmoid"
            params = ClassifyParameters(function_to_apply=function, truncate=truncate)
            answer = await self.classify([(query, text) for text in texts], params, client_gone)
            return [labels[0]["score"] for labels in answer.content], answer
        return await self.similarity(query, texts, EmbedParameters(truncate=truncate), client_gone)

    async def similarity(
        self, source: str, texts: list[str], params: EmbedParameters, client_gone: ClientGone
    ) -> tuple[list[float], Answer]:
        """The cosine similarity of `source`'s embedding and each text's (TEI's /similarity), in the texts'
        order: one request of 1 + len(texts) inputs, each embedding L2-normalised whatever `params` say."""
        unit = params.model_copy(update={"normalize": True})
        answer = await self.embed([source, *texts], unit, client_gone)
        vectors = np.asarray(answer.content)
        return (vectors[1:] @ vectors[0]).tolist(), answer

    async def tokenize(
        self, texts: list[str], add_special_tokens: bool, truncate: bool, prompt_name: str | None = None
    ) -> bytes:
        """Per text, its tokens (TEI's /tokenize), as JSON, the prompt included (service/prompts.py). Bounded
        as a model input is: up to the model's length, past it 413 unless `truncate` (a text far over it
        counted from a prefix); and the answer, some 60 bytes a token, built and written in the tokenizer's
        worker thread, until the deadline."""
        note_model(self.name)
        deadline = self._deadline()
        self._check_count(texts)
        texts = self.prompts.apply(texts, prompt_name)
        return await self._tokenizer_work(
            lambda: pydantic_core.to_json(self.tokenizer.tokens(texts, add_special_tokens, truncate)), deadline
        )

    async def decode(self, sequences: list[list[int]], skip_special_tokens: bool) -> bytes:
        """Per list of token ids, its text (TEI's /decode), as JSON, in a worker thread: each list checked
        as a token-id input of the model is (422 for an id outside the vocabulary, 413 past its length)."""
        note_model(self.name)
        deadline = self._deadline()
        self._check_count(sequences)
        return await self._tokenizer_work(
            lambda: pydantic_core.to_json(self.tokenizer.texts(sequences, skip_special_tokens)), deadline
        )

    # -- the stages -------------------------------------------------------------------------

    def _deadline(self) -> float:
        """The request's deadline, from its arrival at the engine (tokenizing counts against it)."""
        return time.perf_counter() + self.settings.request_timeout_s

    def _admit_tokens(self, encoded: list[Encoded]):
        """Hold the padded positions these inputs will cost, per lane, against the tokens-in-flight
        bound (429)."""
        by_lane: dict[str, int] = {}
        for enc in encoded:
            bucket = bucket_for(enc.length, self.buckets)
            lane = self.batcher.lane_for(bucket).name
            by_lane[lane] = by_lane.get(lane, 0) + bucket
        return self.admission.tokens(by_lane)

    def _check_count(self, items: list) -> None:
        limit = self.settings.max_inputs_per_request
        if len(items) > limit:
            raise ServiceError(422, "validation", f"{len(items)} inputs in one request; at most {limit}")

    async def _encode(
        self,
        items: list,
        truncate: bool = False,
        documents: bool = False,
        limit: int | None = None,
        deadline: float | None = None,
        fill_mask: bool = False,
    ) -> list[Encoded]:
        """Tokenize (`_tokenizer_work`). `limit` (below the model's max length): the most tokens this
        endpoint takes; `truncate` cuts there, else too long is 413, with advice naming only what the
        route accepts (fill-mask has no `truncate`). Its time and the inputs' lengths go to the metrics
        and the request's record (service/telemetry.py)."""

        def advice(error: TooLong) -> str:
            if fill_mask:
                return (
                    f"input {error.index} has {error.counted}; this model takes at most {error.limit}. "
                    "Send shorter text (fill-mask does not truncate)."
                )
            if limit is None or limit >= self.max_length:
                return str(error)
            return (
                f"input {error.index} has {error.counted}; /v1/classify takes at most {limit} "
                "(use /v1/documents/classify for long documents, or set truncate)"
            )

        started = time.perf_counter()
        with self.batcher.expecting():  # queued right after, with no await in between
            encoded = await self._tokenizer_work(
                lambda: self.tokenizer.encode(items, truncate, documents, limit), deadline, advice, text_size(items)
            )
        self._observe_encoded(encoded, started)
        return encoded

    async def _encode_windows(self, items: list, length: int, deadline: float) -> Windows:
        """`_encode` for "overflow": "chunk": the inputs as windows of `length` tokens, at most
        `max_chunk_windows` in all (service/chunking.py), in the same thread, deadline, errors and metrics."""
        policy = WindowPolicy(length, self.settings.max_chunk_windows)
        started = time.perf_counter()
        with self.batcher.expecting():
            windows = await self._tokenizer_work(lambda: split_into_windows(self.tokenizer, items, policy), deadline)
        self._observe_encoded(windows.encoded, started)
        return windows

    async def _encode_spans(self, items: list, truncate: bool, strategy: str, deadline: float) -> list[SpanEncoded]:
        """`_encode` for the per-token heads: the same thread, deadline, errors and metrics, with offsets kept."""
        started = time.perf_counter()
        with self.batcher.expecting():
            encoded = await self._tokenizer_work(
                lambda: self.tokenizer.encode_spans(items, truncate, strategy), deadline, size=text_size(items)
            )
        self._observe_encoded(encoded, started)
        return encoded

    async def _tokenizer_work(
        self, work: Callable[[], T], deadline: float | None, advice=None, size: int | None = None
    ) -> T:
        """`work()`, the tokenizer's (every text of every route is tokenized here): on the loop when `size`, the
        request's characters (`text_size`), is at most TOKENIZE_INLINE_CHARS and the short lane is running a
        batch, else in a worker thread until the deadline (504); its refusals as answers: TooLong 413 (its
        message, or `advice(error)`), another ValueError (a token id outside the vocabulary) 422."""
        remaining = None if deadline is None else max(0.0, deadline - time.perf_counter())
        try:
            if size is not None and size <= TOKENIZE_INLINE_CHARS and self.batcher.short_lane_running():
                return work()
            return await asyncio.wait_for(asyncio.to_thread(work), remaining)
        except TimeoutError:
            raise ServiceError(504, "timeout", "the request deadline passed while its inputs were tokenized") from None
        except TooLong as error:
            raise ServiceError(413, "too_long", advice(error) if advice else str(error)) from None
        except ValueError as error:
            raise ServiceError(422, "validation", str(error)) from None

    def _observe_encoded(self, encoded: list[Encoded], started: float) -> None:
        elapsed = time.perf_counter() - started
        self._tokenization_time.observe(elapsed)
        lengths = self._input_tokens
        tokens = 0
        for enc in encoded:
            lengths.observe(enc.length)
            tokens += enc.length
        record = current_request()
        if record is not None:
            record.inputs, record.tokens = len(encoded), tokens
            record.tokenize_started, record.tokenize_s = started, elapsed

    def _mask_positions(self, index: int, encoded: Encoded) -> np.ndarray:
        found = np.flatnonzero(encoded.input_ids == self.tokenizer.mask_token_id)
        if not len(found):
            raise ServiceError(422, "validation", f"input {index} has no [MASK] token")
        limit = self.settings.max_masks_per_input
        if len(found) > limit:
            raise ServiceError(422, "validation", f"input {index} has {len(found)} [MASK] tokens; at most {limit}")
        return found

    def _check_candidates(self, positions: list[np.ndarray], per_mask: int) -> None:
        """Fill-mask answers are bounded: inputs × [MASK]s × top_k candidates, each with its sequence."""
        limit = self.settings.max_fill_mask_candidates
        masks = sum(len(found) for found in positions)
        if masks * per_mask > limit:
            raise ServiceError(
                422,
                "validation",
                f"this request asks for {masks * per_mask:,} fill-mask candidates ({len(positions)} inputs with "
                f"{masks} [MASK] tokens in all, {per_mask} candidates each); at most {limit:,}: send fewer inputs "
                "or [MASK] tokens, or a smaller top_k",
            )

    async def _target_ids(self, targets: list[str] | str | None) -> list[int] | None:
        """The targets' vocabulary ids (in a worker thread when there are many: unknown words are tokenized)."""
        if targets is None:
            return None
        words = [targets] if isinstance(targets, str) else targets
        if not words:
            raise ServiceError(422, "validation", "targets is an empty list")
        try:
            if len(words) <= 16:
                return self.tokenizer.token_ids(words)
            return await asyncio.to_thread(self.tokenizer.token_ids, words)
        except ValueError as error:
            raise ServiceError(422, "validation", str(error)) from None

    @staticmethod
    async def _postprocess(work: int, function, *args):
        """`function(*args)`, on the loop when small, else in a worker thread (not to stall other requests)."""
        if work <= POSTPROCESS_INLINE_WORK:
            return function(*args)
        return await asyncio.to_thread(function, *args)

    def _submit(
        self, head: str, encoded: list[Encoded], deadline: float, mask_positions: list[np.ndarray] | None = None
    ) -> list[Job]:
        """One job per input, each to its bucket's queue, with the request's deadline."""
        loop = asyncio.get_running_loop()
        jobs = []
        for i, enc in enumerate(encoded):
            job = Job(
                head=head,
                bucket=bucket_for(enc.length, self.buckets),
                encoded=enc,
                future=loop.create_future(),
                deadline=deadline,
                mask_positions=None if mask_positions is None else mask_positions[i],
            )
            self.batcher.submit(job)
            jobs.append(job)
        record = current_request()
        if record is not None:  # each job carries its queue and inference time, bucket and batch size
            record.jobs.extend(jobs)
        return jobs

    async def _await(self, jobs: list[Job], client_gone: ClientGone) -> list[np.ndarray]:
        """Every job's result, unless the deadline passes (504) or the client leaves (499) first;
        whatever is still queued then is cancelled, so the batcher drops it."""
        futures = [job.future for job in jobs]
        deadline = jobs[0].deadline
        gone = asyncio.ensure_future(client_gone())
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
            for future in futures:
                future.cancel()


def _config_field(export_dir: Path, name: str):
    """One field of the export dir's config.json (the model's own config, copied from the artifact)."""
    import json

    return json.loads((export_dir / "config.json").read_text()).get(name)


def text_size(items: list) -> int:
    """A request's inputs in characters, what tokenizing them costs: a text by its length, a pair by both texts',
    a list of token ids by its count."""
    size = 0
    for item in items:
        if isinstance(item, str):
            size += len(item)
        else:  # a (text, text) pair, or token ids
            size += sum(len(part) if isinstance(part, str) else 1 for part in item)
    return size
