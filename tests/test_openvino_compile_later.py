"""OpenVINO's buckets built as a model loads and compiled at their first run (`compile_later`,
service/runtimes/openvino.py): what a start leaves for the long lane's warm-up after ready.

- A runtime given buckets to compile later has read and built them, compiled the others, and answers at every
  bucket bit for bit as a runtime that compiled them all at load; the deferred ones are compiled by their first run.
- At int8-openvino, the weights made int8 are known at load, deferred buckets included: the fp32 copies the model
  drops (service/runtimes `load_runtime`) are the same either way.
- Through the service, with the long lane warming after ready (the default): the long lane's buckets are not
  compiled when the model has loaded, and are once that lane's warm-up has run; warming before ready compiles
  them all at load.

Real runtimes over the tiny service models (tests/service_fixtures.py: buckets 128, 512, 1,024; the long lane
from 1,024). OpenVINO compiles at the bf16 hint on every CPU (f32 where it has no bf16 units), so the runtime's
claims hold on each; the service's needs a CPU where `auto`'s OpenVINO variants run (their precision set outright).
"""

from __future__ import annotations

import numpy as np
import pytest
from precision_fixtures import openvino_precision_here
from test_compiled_cache import _answers


def _load(export_dir, precision, compile_later=()):
    from export.manifest import read_manifest
    from service.runtimes import load_runtime

    manifest = read_manifest(export_dir)
    return load_runtime("onnx", export_dir, manifest, precision=dict.fromkeys(manifest.buckets, precision),
                        compile_later=compile_later)  # fmt: skip


def test_buckets_compiled_at_their_first_run_answer_as_those_compiled_at_load(exports):
    later = _load(exports["mlm"], "bf16", compile_later=[1024])
    assert later.kind == "openvino"
    assert sorted(later.compiled) == [128, 512] and sorted(later.not_compiled) == [1024]
    assert later.buckets == [128, 512, 1024]  # served all the same

    at_load = _load(exports["mlm"], "bf16")
    assert sorted(at_load.compiled) == [128, 512, 1024] and not at_load.not_compiled
    expected, answers = _answers(at_load), _answers(later)
    for key, value in expected.items():
        np.testing.assert_array_equal(answers[key], value, err_msg=str(key))
    assert sorted(later.compiled) == [128, 512, 1024] and not later.not_compiled


def test_at_int8_openvino_the_weights_made_int8_are_known_at_load_deferred_buckets_included(exports):
    later = _load(exports["cls"], "int8-openvino", compile_later=[512, 1024])
    at_load = _load(exports["cls"], "int8-openvino")
    assert later.weights_made_int8() == at_load.weights_made_int8() != set()


@pytest.mark.slow
@pytest.mark.parametrize("warmup_long_lane", ["after-ready", "before-ready"])
def test_the_long_lanes_openvino_buckets_compile_in_its_warm_up_after_ready(variant_exports, warmup_long_lane):
    from service.settings import ServiceSettings
    from service.state import ServiceState

    precision = openvino_precision_here()
    settings = ServiceSettings(models=[f"cls={variant_exports['cls']}"], precision=precision,
                               warmup_long_lane=warmup_long_lane)  # fmt: skip
    state = ServiceState(settings)
    state.load()
    engine = state.models["cls"]
    long_buckets = [b for b in engine.buckets if b >= settings.long_bucket_min_length]
    assert engine.runtime.kind == "openvino" and long_buckets
    if warmup_long_lane == "before-ready":
        assert not engine.runtime.not_compiled
        return
    assert sorted(engine.runtime.not_compiled) == long_buckets
    assert sorted(engine.runtime.compiled) == [b for b in engine.buckets if b not in long_buckets]
    engine.batcher.warm_up(lanes=("long",))  # what `warm_long_lane` runs on the long lane once the service is ready
    assert not engine.runtime.not_compiled and sorted(engine.runtime.compiled) == engine.buckets
