"""The serving process's garbage collector (ingestion/node/heap.py): its start-up heap frozen, so
that a full collection walks only what came after, and a cycle made after still collected. In a
process of its own: ``settle`` sets the whole process, and pytest's must stay as it is."""

from __future__ import annotations

import json
import subprocess
import sys

PROBE = """
import gc, json, weakref
import ingestion.api.server, ingestion.node.worker  # a serving process's modules
from ingestion.node.heap import YOUNG, settle

before = len(gc.get_objects())  # what a full collection walks
frozen = settle()
after = len(gc.get_objects())

class Node:
    pass

a, b = Node(), Node()
a.other, b.other = b, a  # a cycle: only the collector frees it
dead = weakref.ref(a)
del a, b
gc.collect()
print(json.dumps({"before": before, "frozen": frozen, "after": after, "young": gc.get_threshold()[0],
                  "YOUNG": YOUNG, "cycle_collected": dead() is None}))
"""


def test_settle_freezes_the_start_up_heap_and_still_collects_what_comes_after() -> None:
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["before"] > 10_000  # the modules' objects: what every full collection walked
    assert seen["frozen"] >= seen["before"] * 0.9
    assert seen["after"] < 1_000  # a full collection now walks only what came after
    assert seen["young"] == seen["YOUNG"] > 700
    assert seen["cycle_collected"]
