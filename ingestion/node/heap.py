"""The serving process's garbage collector, set once it is up: its start-up heap frozen, the
young generation larger.

Why. CPython's cyclic collector stops the process for a full collection (generation 2) that
walks every tracked object: a node's modules, settings and connections are some 76,000 of them,
12 to 20 ms a walk on this project's 2-core machine, more with a bigger heap. The node's one trio
loop runs its commits, its lease renewals and its subscribers' sends: every task waits out the
walk. And full collections came often: with the default young threshold (700 allocations) a
fan-out to 100 subscribers (a few hundred objects alive per send while it is in flight) promotes
its in-flight objects to the old generation every few commits; they die there and call the next
full walk. ``python -m benchmarks.api_streaming`` (docs/BENCHMARKS.md, "Events API
subscriptions") measured pauses of 37 to 89 ms, 7 or 8 a 40-second run, and those were the
tail of committed -> subscriber.

What. :func:`settle`, once the process serves (its imports done, its listeners and jobs started):

- ``gc.freeze()``: every object alive now moves to the permanent generation, which no collection
  walks. They live as long as the process (modules, classes, settings); garbage among them, if
  any, is never collected: a bounded, one-off cost.
- the young generation's threshold raised from 700 to :data:`YOUNG` allocations: a young
  collection then sees most of a fan-out's objects already dead (freed by reference counting)
  instead of promoting them, so full collections become rare. A cycle made after start-up is still
  collected, at most :data:`YOUNG` allocations later.
"""

from __future__ import annotations

import gc
from typing import Any

YOUNG = 20_000  # allocations (net of deallocations) between young collections; CPython's default is 700


def settle(log: Any = None) -> int:
    """Freeze the heap as it is now and raise the young threshold (see the module docstring);
    logs ``process-heap-settled``. Returns how many objects were frozen. Call it once per
    process, from its entry point (never from a library: it sets the whole process)."""
    gc.collect()  # what is garbage now is not frozen
    gc.freeze()
    frozen = gc.get_freeze_count()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG, older, oldest)
    if log is not None:
        log.info("process-heap-settled", frozen=frozen, young_threshold=YOUNG)
    return frozen
