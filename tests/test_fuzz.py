"""Property-based fuzzing of the OpenAPI contract against a real `bigs serve` (schemathesis).

Every operation of the service's own OpenAPI document gets bodies generated from its schema, both
valid and deliberately invalid (hypothesis, derandomized: the same requests every run), and every
answer is checked: never a 5xx, a status code the operation declares, the declared content type and
headers, a body that conforms to the declared response schema, and schema-invalid bodies refused
(4xx). Valid-looking bodies that the service refuses for a reason the schema cannot express (an
input without [MASK], an unknown model name, a text past the model's length) are 4xx answers in
the service's error shape, which the schema declares; so `positive_data_acceptance` (every
schema-valid body accepted) is the one check left off.
"""

from __future__ import annotations

from collections import Counter

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import (
    content_type_conformance,
    negative_data_rejection,
    not_a_server_error,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)
from schemathesis.config import SchemathesisConfig
from service_fixtures import Server

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    negative_data_rejection,
]
EXAMPLES_PER_OPERATION = 50  # per run; simple operations (GET /health) have far fewer distinct requests
AT_LEAST = 1000  # requests across the operations


KEY = "fuzz-key"


@pytest.fixture(scope="module")
def unguarded(exports, logs):
    """The same without a key: its invalid requests are invalid in their parameters and bodies alone."""
    s = Server({"fill": exports["mlm"], "cls": exports["cls"]}, logs, "fuzz-open", BIGS_WARMUP="false")
    s.wait_ready()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def fuzzed(exports, logs):
    """Both test models, an API key (so the contract's security is fuzzed too: a request without
    the key is one of the invalid ones), warm-up off (the fuzz needs answers, not warmed shapes)."""
    s = Server({"fill": exports["mlm"], "cls": exports["cls"]}, logs, "fuzz", BIGS_WARMUP="false", BIGS_API_KEY=KEY)
    s.wait_ready()
    yield s
    s.stop()


def test_with_a_key_every_operation_but_the_open_paths_declares_the_bearer_scheme(fuzzed):
    doc = httpx.get(f"{fuzzed.url}/openapi.json", headers={"authorization": f"Bearer {KEY}"}).json()
    assert doc["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"
    for path, operations in doc["paths"].items():
        for method, operation in operations.items():
            expected = None if path in ("/health", "/ready") else [{"HTTPBearer": []}]
            assert operation.get("security") == expected, (method, path)


def fuzz(operation, mode: GenerationMode, base_url: str, statuses: Counter) -> int:
    """Send this operation's generated requests of one mode, checking each answer; how many were sent."""
    sent = 0

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(
        max_examples=EXAMPLES_PER_OPERATION,
        derandomize=True,  # a fixed seed: the same requests every run
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    def exercise(case):
        nonlocal sent
        sent += 1
        response = case.call_and_validate(base_url=base_url, checks=CHECKS, timeout=60)
        statuses[response.status_code] += 1

    exercise()
    return sent


@pytest.mark.slow
def test_every_operation_keeps_its_openapi_contract_under_generated_requests(fuzzed, unguarded):
    """Valid and invalid requests to the server with a key (the invalid ones often lack the key:
    401), and invalid ones to the server without (their bodies and parameters reach validation)."""
    config = SchemathesisConfig.from_dict({"auth": {"openapi": {"HTTPBearer": {"bearer": KEY}}}})
    guarded = schemathesis.openapi.from_url(
        f"{fuzzed.url}/openapi.json", config=config, headers={"authorization": f"Bearer {KEY}"}
    )
    unguarded_schema = schemathesis.openapi.from_url(f"{unguarded.url}/openapi.json")
    runs = [(guarded, fuzzed.url, GenerationMode.POSITIVE), (guarded, fuzzed.url, GenerationMode.NEGATIVE),
            (unguarded_schema, unguarded.url, GenerationMode.NEGATIVE)]  # fmt: skip
    sent: Counter[str] = Counter()
    statuses: Counter[int] = Counter()
    failures: list[str] = []
    for schema, url, mode in runs:
        for operation in (result.ok() for result in schema.get_all_operations()):
            label = f"{operation.method.upper()} {operation.path}"
            try:
                sent[label] += fuzz(operation, mode, url, statuses)
            except Unsatisfiable:  # nothing of it can be made invalid (a GET without parameters or key)
                assert mode == GenerationMode.NEGATIVE and operation.method.upper() == "GET", label
            except Exception as failure:  # every operation is fuzzed; the failures are reported together
                failures.append(f"{label} ({mode.value}, {url}): {failure}")
    total = sum(sent.values())
    print(f"schemathesis: {total} requests over {len(sent)} operations: {dict(sent)}; statuses {dict(statuses)}")
    assert not failures, "\n\n".join(failures)
    assert total >= AT_LEAST, sent
    assert statuses[200] > 100 and sum(n for code, n in statuses.items() if 400 <= code < 500) > 100, statuses
    assert fuzzed.proc.poll() is None  # and the server is still up
