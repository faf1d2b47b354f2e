"""The service's startup objects are kept out of the cyclic collector's full walk (service/collector.py).

A full collection holds the GIL for as long as it walks, and with torch, transformers and ONNX Runtime
imported that was 0.2 s on an idle AVX2 EPYC: a 4 MB request of 1,024 small objects set one off and held
/health 0.78 s in the every-route walk (tests/test_every_route_bounded.py). These tests hold the two
claims that fix rests on: what the ready service holds is frozen, and a model switched out is still
collected even if it held a reference cycle.
"""

from __future__ import annotations

import gc
import time
import weakref

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("onnxruntime")

from service.collector import collect_after_switch, keep_startup_out_of_the_collector  # noqa: E402


@pytest.fixture
def thawed():
    """This test process's collector as it was: whatever a test froze is handed back afterwards."""
    gc.unfreeze()
    yield
    gc.unfreeze()


def walked_by_a_full_collection(*objects) -> list[bool]:
    """For each object: would a full collection walk it? (gc.get_objects lists generations 0-2, never
    the frozen one.)"""
    walked = {id(o) for o in gc.get_objects()}
    return [id(o) in walked for o in objects]


def test_a_ready_service_keeps_its_engines_out_of_the_collectors_full_walk(exports, thawed):
    from fastapi.testclient import TestClient

    from service.app import create_app
    from service.settings import ServiceSettings

    app = create_app(ServiceSettings(models=[f"cls={exports['cls']}"], warmup=False))
    with TestClient(app) as client:
        deadline = time.perf_counter() + 120
        while client.get("/ready").status_code != 200:
            assert time.perf_counter() < deadline, "the service did not get ready"
            time.sleep(0.05)
        engine = app.state.service.models["cls"]
        held = [engine, engine.batcher, engine.runtime]
        assert all(gc.is_tracked(o) for o in held)  # the collector would walk them, were they not frozen
        assert walked_by_a_full_collection(*held) == [False] * len(held)
        assert gc.get_freeze_count() > 10_000  # the imported libraries with them, not just a handful
        assert client.post("/v1/classify", json={"inputs": ["the cat sat"]}).status_code == 200


def test_a_model_switched_out_is_collected_even_if_it_held_a_reference_cycle(thawed):
    class Engine:
        pass

    engine = Engine()
    engine.itself = engine  # a cycle: reference counting alone never frees it
    gone = weakref.ref(engine)
    keep_startup_out_of_the_collector()
    del engine
    gc.collect()
    assert gone() is not None  # frozen: a full collection does not see the cycle (why the switch thaws)
    collect_after_switch()
    assert gone() is None
