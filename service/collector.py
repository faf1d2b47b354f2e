"""The cyclic garbage collector and the event loop: what the service holds for its life is kept out of
the collector's full walks, so that a walk no longer holds every request.

A full collection walks every tracked object while holding the GIL, so it holds the event loop and
every lane with it. The service's imports alone (torch, transformers, ONNX Runtime) leave ~242k such
objects, and one walk over them took 0.2 s on an idle AVX2 EPYC; and a 4 MB request of
1,024 small objects, whose parse sets off a full collection, held /health 0.4-0.8 s. `gc.freeze` moves
them to a generation the collector never walks; what requests allocate is collected as before.
"""

from __future__ import annotations

import gc


def keep_startup_out_of_the_collector() -> None:
    """Once the models are loaded and warm, before admission opens: every object alive now (the imported
    libraries, tokenizers, engines) leaves the collector's reach for the life of the process.

    Frozen objects still go by reference counting when let go; only a cycle among them would outlive
    its use, which is why a model switched out hands them back first (`collect_after_switch`)."""
    gc.collect()  # what loading left as cyclic garbage goes now, not into the frozen set
    gc.freeze()


def collect_after_switch() -> None:
    """After a model is switched to its export (service/preparation.py): the engine it replaced was
    frozen with the rest at startup, so it is handed back to the collector, collected, and what is left
    frozen again (one full walk, once per switch)."""
    gc.unfreeze()
    keep_startup_out_of_the_collector()
