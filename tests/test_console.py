"""What a user reads while `bigs export` runs and `bigs serve` starts: progress lines, no third-party noise.

Fast: the progress line's arithmetic (export/progress.py), the filters of export/quiet.py (each drops
its message and nothing else), the precision words and the start-up breakdown of the ready lines.
Slow: a real `bigs export` of a tiny model, in a subprocess as a user runs it: one line per bucket of
each stage, and none of the library lines export/quiet.py drops. The ready line of a real `bigs serve`
is checked in tests/test_service.py (its main server).
"""

from __future__ import annotations

import logging
import re
import subprocess
import sys
import time

import pytest

from export.progress import Job, Progress, phases, seconds, silent
from export.quiet import KNOWN, DropMessages

# -- progress lines -----------------------------------------------------------------------------


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_line_per_step_with_its_time_the_elapsed_time_and_what_is_left():
    clock, lines = Clock(), []
    progress = Progress("export m", 3, emit=lines.append, started=90.0, clock=clock)
    clock.now = 102.0
    progress.step("onnx bucket 128")
    clock.now = 106.0
    progress.step("onnx bucket 512")
    clock.now = 109.5
    progress.step("onnx bucket 4096")
    assert lines == [
        "export m: onnx bucket 128 (1/3) done in 2.0 s — 12 s elapsed, ~4.0 s left",  # 2 s a step, 2 to go
        "export m: onnx bucket 512 (2/3) done in 4.0 s — 16 s elapsed, ~3.0 s left",  # 3 s a step, 1 to go
        "export m: onnx bucket 4096 (3/3) done in 3.5 s — 20 s elapsed",  # the last says nothing is left
    ]


def test_what_is_left_is_scaled_by_the_weight_still_to_do():
    clock, lines = Clock(), []
    progress = Progress("warm-up cls", [1, 9], emit=lines.append, started=100.0, clock=clock)
    clock.now = 101.0
    progress.step("bucket 128")
    assert lines == ["warm-up cls: bucket 128 (1/2) done in 1.0 s — 1.0 s elapsed, ~9.0 s left"]


def test_the_stages_of_a_job_count_elapsed_time_from_its_start():
    lines = []
    job = Job("export m", emit=lines.append, started=time.perf_counter() - 60)
    job.stage(1).step("parity")
    assert re.fullmatch(r"export m: parity \(1/1\) done in 0\.0 s — 60 s elapsed", lines[0])
    assert Job("quiet").emit is silent  # a job nobody watches says nothing


def test_durations_read_as_a_person_would_say_them():
    assert [seconds(0.42), seconds(41.2), seconds(185), seconds(12.34, precise=True)] == [
        "0.4 s",
        "41 s",
        "3 min 05 s",
        "12.3 s",
    ]
    assert phases({"install": 12.34, "load": 0.4, "warm-up": 130}) == "install 12.3 s, load 0.4 s, warm-up 2 min 10 s"


# -- quiet: each known message dropped, everything else kept ------------------------------------


def emitted(logger: logging.Logger, level: int, message: str, *args) -> bool:
    """Whether a record logged on `logger` passes the logger's own filters."""
    record = logger.makeRecord(logger.name, level, __file__, 0, message, args, None)
    return all(f.filter(record) for f in logger.filters)


def test_quiet_drops_the_known_lines_and_nothing_else():
    for name, start, _why in KNOWN:
        logger = logging.getLogger(f"test-console-{name or 'root'}")  # a stand-in: the real one stays untouched
        logger.addFilter(DropMessages((start,)))
        assert not emitted(logger, logging.WARNING, start + " nms")
        assert emitted(logger, logging.WARNING, "something else went wrong")
        assert emitted(logger, logging.ERROR, "export failed: " + start)  # matched at the start only
    torch_line = KNOWN[0]
    logger = logging.getLogger("test-console-args")
    logger.addFilter(DropMessages((torch_line[1],)))
    # torch logs it with an argument: the filter sees the formatted message
    assert not emitted(logger, logging.WARNING, "torchvision is not installed. Skipping %s", "torchvision::nms")


# -- the ready lines --------------------------------------------------------------------------


def test_precision_words_name_one_precision_or_each_with_its_buckets():
    pytest.importorskip("onnxruntime")
    from service.state import precision_words

    assert precision_words({128: "int8", 512: "int8"}) == "int8"
    assert precision_words({4096: "bf16", 128: "int8", 512: "fp32", 256: "int8"}) == (
        "int8 at 128, 256 + fp32 at 512 + bf16 at 4096"
    )


def test_the_start_up_line_puts_the_earlier_phases_before_load_and_warm_up():
    pytest.importorskip("fastapi")
    from pydantic import ValidationError

    from service.settings import ServiceSettings
    from service.state import ServiceState

    settings = ServiceSettings(startup_phases="install=12.34 prepare=0")
    assert settings.earlier_phases() == {"install": 12.34, "prepare": 0.0}
    state = ServiceState(settings, started=time.perf_counter() - 3)
    state.warm_up_s = 1.0
    ready, breakdown = state.ready_lines()
    assert ready.startswith("ready at http://127.0.0.1:8000 in 3.")
    assert re.fullmatch(r"start-up: install 12\.3 s, prepare 0\.0 s, load 2\.\d s, warm-up 1\.0 s", breakdown)
    for bad in ("install", "install=soon", "=3", "install=-1"):
        with pytest.raises(ValidationError, match="NAME=SECONDS"):
            ServiceSettings(startup_phases=bad)


# -- a real `bigs export` -----------------------------------------------------------------------


@pytest.mark.slow
def test_bigs_export_prints_a_line_per_bucket_and_no_library_noise(tiny_model, tiny_bert_config, tmp_path):
    pytest.importorskip("onnxruntime")
    from service_fixtures import ROOT, _clean_env

    from model.tokenizer import save_tokenizer

    artifact, out = tmp_path / "artifact", tmp_path / "export"
    tiny_model(config=tiny_bert_config(max_position_embeddings=256)).save_pretrained(artifact)
    save_tokenizer(artifact, model_max_length=256)
    # int8: ORT's quantizer runs (one of the known messages), and its gate per bucket; ONNX only, to be quick
    run = subprocess.run(
        [sys.executable, "-m", "bigs_cli", "export", str(artifact), str(out), "--formats", "onnx"]
        + ["--precisions", "int8"],
        cwd=ROOT,
        env=_clean_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    console = run.stdout + run.stderr
    assert run.returncode == 0, console
    lines = console.splitlines()
    prefix = f"export {artifact}: "
    onnx = [line for line in lines if line.startswith(prefix + "onnx bucket")]
    assert len(onnx) == 2, console  # the model's buckets: 128 and its length, 256
    assert re.match(r".*onnx bucket 128 \+ int8 \(1/2\) done in [\d.]+ s — [\d.]+ s elapsed, ~[\d.]+ s left$", onnx[0])
    assert re.match(r".*onnx bucket 256 \+ int8 \(2/2\) done in [\d.]+ s — [\d.]+ s elapsed$", onnx[1])
    # bucket by bucket: the gate there, then the timing there (a bucket the search gated as written says its
    # figures are the search's: "… passed as the int8 search measured it")
    measured = [
        re.search(r"(int8 gate|latency of fp32, int8 at) bucket (\d+)[a-zA-Z0-9 ]* \((\d)/4\)", line) for line in lines
    ]
    assert [m.group(1, 2, 3) for m in measured if m] == [
        ("int8 gate", "128", "1"),
        ("latency of fp32, int8 at", "128", "2"),
        ("int8 gate", "256", "3"),
        ("latency of fp32, int8 at", "256", "4"),
    ], console
    references = [line for line in lines if line.startswith(prefix + "torch reference bucket")]
    assert [re.search(r"bucket (\d+) \((\d)/2\)", r).group(1, 2) for r in references] == [("128", "1"), ("256", "2")]
    checked = [re.search(r"parity (onnx \w+ bucket \d+) \((\d)/4\)", line) for line in lines]
    assert [m.group(1, 2) for m in checked if m] == [
        ("onnx fp32 bucket 128", "1"),
        ("onnx fp32 bucket 256", "2"),
        ("onnx int8 bucket 128", "3"),
        ("onnx int8 bucket 256", "4"),
    ], console
    assert prefix + "parity against torch passed" in lines
    for _name, start, _why in KNOWN:
        assert start not in console
    assert "torchvision" not in console and "Loading weights" not in console
    assert "\r" not in console  # plain lines: no carriage-return bar
