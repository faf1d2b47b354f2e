"""Locust scenarios for the BiGS service: long documents, mixed short and long, fill-mask bursts.

    bigs bench load --scenario long|mixed|fill-mask ...        (bench/load.py runs this file headless)
    locust -f bench/locustfile.py --host http://127.0.0.1:8000 LongDocumentUser|MixedUser|FillMaskBurstUser

Scenarios are user classes:
    LongDocumentUser   one document of 2,000-4,096 tokens per request (/v1/documents/classify when a
                       classification model is served, else /v1/embed), the service's reason to exist;
                       one request in four a document of 2-4 times the model's length, read in
                       windows ("overflow": "chunk"; named "<endpoint> chunked")
    MixedUser          mostly short requests (classify, embed, fill-mask; 8-512 tokens) with a long
                       document now and then: do long batches hold short ones back?
    FillMaskBurstUser  bursts of concurrent fill-mask requests (8-512 tokens), then a pause: the batcher

Text is real English, not repeated words: paragraphs of the Python standard library's docstrings (or
the files given by --text-file / BIGS_LOAD_TEXT), cut at word boundaries to an exact token count
measured with the model's tokenizer (--tokenizer / BIGS_LOAD_TOKENIZER: a tokenizer.json; default the
BERT uncased vocab in model/assets, which is what the models use): bench/text_corpus.py. Lengths are
capped at the served model's maximum (GET /v1/models), so a 1,024-token model gets "long" documents
of 512-1,024 tokens.

Each request is named "<endpoint> [<lo>-<hi>]" by the length band of its input (the service's
buckets), so locust's own statistics split by length too, and every request is also written as one
row (time, endpoint, band, tokens, latency, status, server timings) to --samples-csv /
BIGS_LOAD_SAMPLES, from which bench/load.py draws the summary and the latency-against-length plot.
"""

from __future__ import annotations

import csv
import json
import os
import random
import time
import urllib.request
import zlib
from pathlib import Path

import gevent
from locust import HttpUser, between, events, task
from text_corpus import Corpus, load_tokenizer, stdlib_docstrings  # locust puts this file's folder on sys.path

# Length bands = the service's buckets: an input of 513-1,024 tokens runs in the 1,024 bucket.
BAND_EDGES = (128, 256, 512, 1024, 2048, 4096, 8192)
LONG_RANGE = (2000, 4096)  # the corpus holds two of the longest (text_corpus.MIN_TOKENS)
CHUNKED_TIMES = (2, 4)  # chunked documents: 2-4 times the served model's length (8,192-16,384 at 4,096)
POOL_SIZE = 48  # distinct texts per (kind, length range); requests draw from the pool
SAMPLE_FIELDS = [
    "start_unix",
    "endpoint",
    "band",
    "tokens",
    "latency_ms",
    "status",
    "ok",
    "server_total_ms",
    "queue_ms",
    "inference_ms",
    "error",
]


@events.init_command_line_parser.add_listener
def _options(parser):
    parser.add_argument("--samples-csv", default=os.environ.get("BIGS_LOAD_SAMPLES", ""), help="per-request rows")
    parser.add_argument("--tokenizer", default=os.environ.get("BIGS_LOAD_TOKENIZER", ""), help="tokenizer.json")
    parser.add_argument("--text-file", default=os.environ.get("BIGS_LOAD_TEXT", ""), help="text files (os.pathsep)")
    parser.add_argument("--api-key", default=os.environ.get("BIGS_API_KEY", ""), help="Bearer key of the service")
    parser.add_argument("--text-seed", type=int, default=int(os.environ.get("BIGS_LOAD_SEED", "0")))


def band_of(tokens: int) -> str:
    lo = 1
    for edge in BAND_EDGES:
        if tokens <= edge:
            return f"[{lo}-{edge}]"
        lo = edge + 1
    return f"[>{BAND_EDGES[-1]}]"


# -- text ------------------------------------------------------------------------------------------


# -- shared state: the corpus, the served models, the samples file --------------------------------


class Shared:
    corpus: Corpus | None = None
    pools: dict = {}
    models: dict[str, dict] = {}  # task -> model card
    samples = None
    writer = None
    headers: dict = {}
    seed = 0


def _served_models(host: str, headers: dict, timeout: float = 120) -> dict[str, dict]:
    """{task: card} of the first model doing each task, once /ready says yes."""
    deadline = time.time() + timeout
    while True:
        try:
            with urllib.request.urlopen(urllib.request.Request(f"{host}/ready"), timeout=5) as r:
                if r.status == 200:
                    break
        except OSError:
            pass
        if time.time() > deadline:
            raise SystemExit(f"{host} not ready after {timeout:.0f} s")
        time.sleep(1)
    with urllib.request.urlopen(urllib.request.Request(f"{host}/v1/models", headers=headers), timeout=30) as r:
        cards = json.loads(r.read())["data"]  # OpenAI's list shape
    tasks: dict[str, dict] = {}
    for card in cards:
        if card.get("status") == "failed":
            continue
        for t in card["tasks"]:
            tasks.setdefault(t, card)
    return tasks


@events.init.add_listener
def _on_init(environment, **_):
    """Before the run-time clock starts: wait for the service, read its models, build the corpus."""
    options = environment.parsed_options
    Shared.headers = {"authorization": f"Bearer {options.api_key}"} if options and options.api_key else {}
    if environment.host:
        Shared.models = _served_models(environment.host.rstrip("/"), Shared.headers)
    started = time.perf_counter()
    tokenizer = load_tokenizer(options.tokenizer if options else "")
    if options and options.text_file:
        text = "\n\n".join(Path(p).read_text(errors="replace") for p in options.text_file.split(os.pathsep) if p)
    else:
        text = stdlib_docstrings()
    Shared.seed = options.text_seed if options else 0
    Shared.corpus = Corpus(tokenizer, text, seed=Shared.seed)
    for task_name, card in Shared.models.items():  # the pools of the lengths the scenarios ask for
        for lo, hi in ((8, 128), (8, 256), (8, 512), (LONG_RANGE[0], LONG_RANGE[1])):
            texts(task_name, *capped(lo, hi, card["max_length"]), random.Random(0), mask=task_name == "fill-mask")
        if task_name in ("classification", "embeddings"):
            texts(task_name, *chunked_range(card["max_length"]), random.Random(0))
    print(f"locustfile: corpus of {Shared.corpus.n} tokens, text pools built in {time.perf_counter() - started:.1f} s; "
          f"serving {{task: model}} = { {t: c['id'] for t, c in Shared.models.items()} }")  # fmt: skip


@events.test_start.add_listener
def _on_test_start(environment, **_):
    options = environment.parsed_options
    if options and options.samples_csv:
        Path(options.samples_csv).parent.mkdir(parents=True, exist_ok=True)
        Shared.samples = open(options.samples_csv, "w", newline="")  # noqa: SIM115 (closed at test_stop)
        Shared.writer = csv.writer(Shared.samples)
        Shared.writer.writerow(SAMPLE_FIELDS)


@events.test_stop.add_listener
def _on_test_stop(environment, **_):
    if Shared.samples is not None:
        Shared.samples.close()
        Shared.samples = Shared.writer = None


@events.request.add_listener
def _on_request(request_type, name, response_time, response_length, response=None, context=None,
                exception=None, start_time=None, **_):  # fmt: skip
    if Shared.writer is None or not context or "tokens" not in context:
        return
    headers = getattr(response, "headers", None) or {}
    status = getattr(response, "status_code", 0) or 0
    Shared.writer.writerow(
        [
            f"{start_time or time.time():.3f}",
            context["endpoint"],
            context["band"],
            context["tokens"],
            f"{response_time:.2f}",
            status,
            int(exception is None),
            headers.get("x-total-time", ""),
            headers.get("x-queue-time", ""),
            headers.get("x-inference-time", ""),
            "" if exception is None else str(exception)[:200].replace("\n", " "),
        ]
    )


def capped(lo: int, hi: int, max_length: int) -> tuple[int, int]:
    """The length range lo..hi within the model's max (a "long" range of a 1,024-token model: 512-1,024)."""
    hi = min(hi, max_length)
    return min(lo, hi // 2), hi


def chunked_range(max_length: int) -> tuple[int, int]:
    """The lengths of the documents read in windows: past the model's length, CHUNKED_TIMES of it."""
    return CHUNKED_TIMES[0] * max_length, CHUNKED_TIMES[1] * max_length


def texts(kind: str, lo: int, hi: int, rng: random.Random, mask: bool = False) -> tuple[str, int]:
    """A text of lo..hi tokens from the pool of (kind, lo, hi), built on first use."""
    key = (kind, lo, hi, mask)
    pool = Shared.pools.get(key)
    if pool is None:
        build_rng = random.Random(zlib.crc32(repr(key).encode()) + Shared.seed)
        pool = [Shared.corpus.document(build_rng.randint(lo, hi), build_rng, mask) for _ in range(POOL_SIZE)]
        Shared.pools[key] = pool
    return rng.choice(pool)


# -- users -----------------------------------------------------------------------------------------


class BiGSUser(HttpUser):
    abstract = True

    def on_start(self):
        self.rng = random.Random()
        if not Shared.models:  # locust started without --host (the web UI asks for it later)
            Shared.models = _served_models(self.host.rstrip("/"), Shared.headers)

    def post(self, endpoint: str, task_name: str, lo: int, hi: int, mask: bool = False, extra: dict | None = None,
             chunked: bool = False):  # fmt: skip
        """POST one input of lo..hi tokens (capped at the model's max unless `chunked`: read in windows)
        and check the answer's shape."""
        card = Shared.models[task_name]
        if chunked:
            lo, hi = chunked_range(card["max_length"])
            extra = {**(extra or {}), "parameters": {"overflow": "chunk"}}
        else:
            lo, hi = capped(lo, hi, card["max_length"])
        text, tokens = texts(task_name, lo, hi, self.rng, mask)
        body = {"inputs": text, "model": card["id"], **(extra or {})}
        label = f"{endpoint} chunked" if chunked else endpoint
        context = {"endpoint": label, "band": band_of(tokens), "tokens": tokens}
        name = f"{label} {context['band']}"
        with self.client.post(endpoint, json=body, name=name, context=context, headers=Shared.headers,
                              catch_response=True) as response:  # fmt: skip
            if response.status_code != 200:
                response.failure(f"{response.status_code}: {response.text[:200]}")
                return
            problem = check_answer(task_name, response.json(), card)
            if problem:
                response.failure(problem)

    def long_document(self, chunked: bool = False):
        if "classification" in Shared.models:
            self.post("/v1/documents/classify", "classification", *LONG_RANGE, chunked=chunked)
        else:
            self.post("/v1/embed", "embeddings", *LONG_RANGE, chunked=chunked)


def check_answer(task_name: str, body, card: dict) -> str | None:
    """None when the answer has the documented shape, else what is wrong."""
    if task_name == "fill-mask":
        ok = (
            isinstance(body, list) and body and all({"sequence", "score", "token", "token_str"} <= set(c) for c in body)
        )
    elif task_name == "classification":
        labels = set(card.get("labels") or [])
        # one input: one list of labels, nested ([[{label, score}, …]])
        ok = isinstance(body, list) and len(body) == 1 and {c.get("label") for c in body[0]} == labels
    else:
        ok = isinstance(body, dict) and len(body.get("embeddings", [])) == 1
    return None if ok else f"unexpected answer: {json.dumps(body)[:200]}"


class LongDocumentUser(BiGSUser):
    """Only long documents: 2,000-4,096 tokens (capped at the model's max) in one pass, and one request in
    four 2-4 times the model's max, read in windows."""

    wait_time = between(0.2, 1.0)

    @task(3)
    def document(self):
        self.long_document()

    @task(1)
    def chunked_document(self):
        self.long_document(chunked=True)


class MixedUser(BiGSUser):
    """Short classify / embed / fill-mask requests, and one long document in ~10 requests."""

    wait_time = between(0.1, 0.5)

    @task(4)
    def classify_short(self):
        if "classification" in Shared.models:
            self.post("/v1/classify", "classification", 8, 256)
        else:
            self.embed_short()

    @task(2)
    def embed_short(self):
        self.post("/v1/embed", "embeddings", 8, 512)

    @task(3)
    def fill_mask_short(self):
        if "fill-mask" in Shared.models:
            self.post("/v1/fill-mask", "fill-mask", 8, 128, mask=True, extra={"parameters": {"top_k": 5}})
        else:
            self.embed_short()

    @task(1)
    def document(self):
        self.long_document()


class FillMaskBurstUser(BiGSUser):
    """A burst of BURST concurrent fill-mask requests (8-512 tokens), then a pause of 1-3 s."""

    BURST = 8
    wait_time = between(1.0, 3.0)

    @task
    def burst(self):
        task_name = "fill-mask" if "fill-mask" in Shared.models else "embeddings"
        endpoint = "/v1/fill-mask" if task_name == "fill-mask" else "/v1/embed"

        def one():
            hi = 128 if self.rng.random() < 0.75 else 512
            self.post(endpoint, task_name, 8, hi, mask=task_name == "fill-mask")

        gevent.joinall([gevent.spawn(one) for _ in range(self.BURST)])


SCENARIOS = {"long": "LongDocumentUser", "mixed": "MixedUser", "fill-mask": "FillMaskBurstUser"}
