"""Shared fixtures: tiny BiGS configs and models (2 layers, hidden 64), realistic S4D parameters.

Everything that needs torch or transformers is imported inside the fixtures, so test files of a
serving-only install (no torch) can still use this conftest.
"""

from __future__ import annotations

import math
import os
import sys

import pytest

# The shapes of every tiny model in the test suite (docs/DESIGN.md §5.6).
TINY = dict(
    vocab_size=128,
    hidden_size=64,
    num_hidden_layers=2,
    intermediate_size=192,
    max_position_embeddings=128,
    type_vocab_size=2,
    num_ssm=64,
    # At hidden 64 the published init (std 0.02) leaves the gated SSM branch ~1e-7 of the residual
    # stream: a tiny model would be the identity on its embeddings, and every test comparing
    # outputs at 1e-5 would pass whatever the SSM did. With std 0.12 each layer changes its
    # input by O(1), so padding leaks, formulations and weight mix-ups all show.
    initializer_range=0.12,
)

# The real BERT uncased WordPiece vocab, for tests that need the tokenizer (pipelines, service).
BERT_VOCAB_SIZE = 30522


def pytest_xdist_auto_num_workers(config):
    """`-n auto` (pyproject's addopts): one worker per CPU this process may use, at most 4 and at most
    one per 8 GiB of memory.

    Most of the suite runs one torch thread or waits on a server it started, so one process left a
    2-core machine a third idle (vmstat over a whole run); two workers keep it busy. A worker holds
    torch, jax and ONNX Runtime and peaked at 6.2 GB (2-core run, 24 GiB machine), hence the memory
    bound; past 4 the longest files set the pace.
    """
    cpus = len(os.sched_getaffinity(0))
    memory_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return max(1, min(cpus, 4, int(memory_gib // 8)))


@pytest.fixture(scope="session", autouse=True)
def _torch_threads():
    """One torch thread by default (BIGS_TEST_THREADS overrides).

    Tiny-config ops gain nothing from intra-op threads, and on a shared 2-core machine OpenMP
    threads waiting on each other made the suite ~3x slower. Test modules are imported before
    session fixtures run, so torch is in sys.modules exactly when some test uses it.
    """
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(int(os.environ.get("BIGS_TEST_THREADS", "1")))
    yield


@pytest.fixture
def tiny_config():
    """Factory: ``tiny_config(**overrides) -> BiGSConfig`` with the TINY shapes.

    Dropout is off by default so that outputs are deterministic even in train mode.
    """
    from model import BiGSConfig

    def make(**overrides):
        fields = dict(TINY, hidden_dropout_prob=0.0)
        fields.update(overrides)
        return BiGSConfig(**fields)

    return make


@pytest.fixture
def tiny_bert_config(tiny_config):
    """Factory: a tiny config over the real 30,522-entry BERT vocab (what the tokenizer emits)."""

    def make(**overrides):
        return tiny_config(**{"vocab_size": BERT_VOCAB_SIZE, **overrides})

    return make


def _perturb_(model, seed: int) -> None:
    """Give the parameters that `_init_weights` sets to constants (biases, LayerNorm gains, the CLAP head's β)
    or to near zero (gMLP's spatial weight) random values.

    Tests that compare weights or outputs across save/load, formulations or padding then also
    catch a bias or LayerNorm that is dropped, mis-named or mis-tied, and a gMLP whose positions leak:
    at its init (±1e-3 / N) the spatial weight would mix positions too little for a leak to show.
    """
    import torch

    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():  # tied tensors are listed once
            if name.endswith("bias") or name.endswith("LayerNorm.weight") or name.endswith("predictions.beta"):
                p.add_(0.05 * torch.randn(p.shape, generator=g, dtype=p.dtype))
            elif name.endswith("spatial.weight"):
                p.add_(0.1 * torch.randn(p.shape, generator=g, dtype=p.dtype))


@pytest.fixture
def tiny_model(tiny_config):
    """Factory: ``tiny_model(cls=BiGSForMaskedLM, seed=0, config=None, **config_overrides)``.

    A randomly initialized model in eval mode, reproducible from `seed`, with non-trivial biases and
    LayerNorm parameters. Pass `config` to use a prepared config instead of `tiny_config(**overrides)`.
    """
    import torch

    from model import BiGSForMaskedLM

    def make(cls=BiGSForMaskedLM, seed: int = 0, config=None, **overrides):
        config = config if config is not None else tiny_config(**overrides)
        torch.manual_seed(seed)
        model = cls(config)
        _perturb_(model, seed)
        return model.eval()

    return make


@pytest.fixture
def s4d_params():
    """Factory: ``s4d_params(N=64, case="s4d_lin", seed=0) -> dict(log_step, A_re, A_im, C)`` (float32).

    Cases (all with A_im = π·n and C ~ N(0, 1/2), as the S4D-Lin init of the published model):
      "s4d_lin"     A_re = −1/2, log_step ~ U[log 0.01, log 1]  (the init)
      "slow_decay"  A_re ≈ −1e-3, dt = 1: per-step decay e^−0.001, still e^−4 at l = 4096 — the
                    long-range part of the kernel matters at every length
      "slower"      A_re ≈ −1e-3, dt = 0.01: decay e^−1e-5 per step, almost none over 4096
      "clamped"     A_re ~ U[−1, 1]: the positive half is clamped to −1e-4 by the kernel
    """
    import torch

    def make(N: int = 64, case: str = "s4d_lin", seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        C = torch.randn(N, 2, generator=g) * 0.5**0.5
        A_im = math.pi * torch.arange(N, dtype=torch.float32)
        if case == "s4d_lin":
            A_re = torch.full((N,), -0.5)
            log_step = torch.empty(1).uniform_(math.log(0.01), math.log(1.0), generator=g)
        elif case == "slow_decay":
            A_re = -1e-3 * (1 + 0.1 * torch.rand(N, generator=g))
            log_step = torch.tensor([math.log(1.0)])
        elif case == "slower":
            A_re = -1e-3 * (1 + 0.1 * torch.rand(N, generator=g))
            log_step = torch.tensor([math.log(0.01)])
        elif case == "clamped":
            A_re = torch.rand(N, generator=g) * 2 - 1
            log_step = torch.empty(1).uniform_(math.log(0.01), math.log(1.0), generator=g)
        else:
            raise ValueError(case)
        return dict(log_step=log_step, A_re=A_re, A_im=A_im, C=C)

    return make


@pytest.fixture
def other_vocab_teacher(tmp_path):
    """The default teacher's config and weights beside a vocab.txt with ids 2000 and 2001 swapped: the same
    tokens, another vocabulary. Returns the dir and its vocab.txt's lines."""
    import shutil

    from model.tokenizer import BERT_UNCASED_VOCAB
    from training.teacher import default_teacher_dir

    teacher_dir = tmp_path / "other-vocab-bert"
    teacher_dir.mkdir()
    source = default_teacher_dir()
    shutil.copy(source / "config.json", teacher_dir / "config.json")
    (teacher_dir / "model.safetensors").symlink_to(source / "model.safetensors")
    lines = BERT_UNCASED_VOCAB.read_text(encoding="utf-8").splitlines()
    lines[2000], lines[2001] = lines[2001], lines[2000]
    (teacher_dir / "vocab.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return teacher_dir, lines


# -- the service's tiny exported models (tests/service_fixtures.py), shared by every service test module --


def _once_per_run(tmp_path_factory, name: str, exports: tuple[str, ...], build, root=None) -> dict:
    """{export: its dir (root/export-<export>)}, `build(root)` run once per test run and shared by the run's
    pytest-xdist workers; `root` given (SERVICE_TEST_EXPORTS), kept between runs."""
    from filelock import FileLock

    if root is None and "PYTEST_XDIST_WORKER" not in os.environ:  # one process: its own tmp dir
        root = tmp_path_factory.mktemp(name)
    elif root is None:  # xdist workers: the run's tmp dir, above each worker's own, and the first to get there builds
        root = tmp_path_factory.getbasetemp().parent / name
    outs = {export: root / f"export-{export}" for export in exports}
    root.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(root) + ".lock"):
        if not all((out / "manifest.json").is_file() for out in outs.values()):
            outs = build(root)
    return outs


@pytest.fixture(scope="session")
def exports(tmp_path_factory):
    """{"mlm", "cls": export dirs, "art-mlm", "art-cls": their artifacts}; built once per run (shared by the
    run's pytest-xdist workers), or kept between runs in SERVICE_TEST_EXPORTS."""
    from pathlib import Path

    from service_fixtures import build_exports

    keep = os.environ.get("SERVICE_TEST_EXPORTS")
    outs = _once_per_run(
        tmp_path_factory, "service-models", ("mlm", "cls"), build_exports, Path(keep) if keep else None
    )
    root = outs["mlm"].parent
    return {**outs, "art-mlm": root / "art-mlm", "art-cls": root / "art-cls"}


@pytest.fixture(scope="session")
def logs(tmp_path_factory):
    return tmp_path_factory.mktemp("service-logs")


# -- reduced precision: the variants' export dirs (tests/precision_fixtures.py), shared by the precision test files --


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    """The project's BERT uncased WordPiece, as the export dirs hold it (tokenizer.json)."""
    from tokenizers import Tokenizer

    from model.tokenizer import save_tokenizer

    out = tmp_path_factory.mktemp("tokenizer")
    save_tokenizer(out)
    tokenizer = Tokenizer.from_file(str(out / "tokenizer.json"))
    tokenizer.no_truncation()
    return tokenizer


@pytest.fixture(scope="session")
def variant_exports(tmp_path_factory):
    """{"mlm", "cls": export dirs} with int8, bf16 and int8-openvino variants (precision_fixtures.py
    `build_variant_exports`); built once per run, shared by the run's pytest-xdist workers."""
    from precision_fixtures import build_variant_exports

    return _once_per_run(tmp_path_factory, "precision", ("mlm", "cls"), build_variant_exports)


@pytest.fixture(scope="session")
def default_exports(tmp_path_factory):
    """{"cls", "mlm", "cls-none": export dirs} of `bigs export` without --precisions (precision_fixtures.py
    `build_default_exports`); built once per run, shared by the run's pytest-xdist workers."""
    from precision_fixtures import DEFAULT_EXPORTS, build_default_exports

    return _once_per_run(tmp_path_factory, "default-precisions", DEFAULT_EXPORTS, build_default_exports)
