"""Third-party chatter that tells a user of `bigs export` nothing, dropped where it is emitted.

Each message is matched by the logger that emits it and the start of its text, so every other
message of the same library, its warnings and errors included, still reaches the console. `quiet()`
runs once at the start of `bigs export` (bigs_cli.py); tests/test_export.py runs a real export and
checks that none of these lines comes back.
"""

from __future__ import annotations

import logging

# (logger name, start of the message, why it is noise here)
KNOWN = (
    (
        "torch.onnx._internal.exporter._registration",
        "torchvision is not installed. Skipping torchvision::",
        # torch.onnx builds its op table on every export call (once per bucket here) and names each
        # torchvision op it cannot register: nms, roi_align, … A text encoder uses none of them.
        "four lines per bucket about image ops BiGS never uses",
    ),
    (
        "",  # the root logger: onnxruntime.quantization calls logging.warning directly
        "Please consider to run pre-processing before quantization",
        # ORT's advice for CNN image models, printed by every int8 quantization (once per bucket). The
        # int8 graphs are ORT-optimized after quantization, and their accuracy is what the gate measures.
        "once per bucket: advice for image models; the int8 gate measures what matters",
    ),
)


class DropMessages(logging.Filter):
    """Drops a logger's records whose message starts with one of `starts`; passes every other one."""

    def __init__(self, starts: tuple[str, ...]):
        super().__init__()
        self.starts = starts

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(self.starts)


def quiet() -> None:
    """Install the filters (idempotent), and turn off transformers' "Loading weights" bar: a
    carriage-return bar in a log of plain lines, for a load that takes well under a second."""
    by_logger: dict[str, list[str]] = {}
    for name, start, _why in KNOWN:
        by_logger.setdefault(name, []).append(start)
    for name, starts in by_logger.items():
        # A logger's own filters see only the records it creates (not its children's), so each filter
        # sits on the exact logger that emits the message.
        logger = logging.getLogger(name)
        if not any(isinstance(f, DropMessages) for f in logger.filters):
            logger.addFilter(DropMessages(tuple(starts)))
    try:
        from transformers.utils import logging as transformers_logging
    except ImportError:  # an install without transformers has no such bar
        return
    transformers_logging.disable_progress_bar()
