"""Deliberately broken builds, to check that the campaign catches what it claims to.

:func:`build` copies the code the nodes run (``actors/`` and ``ingestion/``) into a directory and
applies one mutant's edits; the campaign runs its nodes from that copy (``Options.build``, the
nodes' ``PYTHONPATH``), the harness and the judge from the real code. Every edit must apply
exactly once, or :func:`build` refuses: a mutant that silently changed nothing would make the
test that uses it pass for the wrong reason.

- ``no-fence``: the commit script (``actors/lease_store/lua/commit.lua``) without its token check
  and its cursor checks: a commit is applied whoever sends it and whenever it lands, after the
  cursor the writer believes in. A leader cut off from Redis with a commit on its way has that
  commit delivered once the partition heals (:mod:`ingestion.testing.partition` holds it, as a
  network's queues and TCP's retransmissions would), after another node has taken over: the real
  script refuses it (``lease-lost``), the mutant appends its records a second time.
"""

from __future__ import annotations

import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

COMMIT = "actors/lease_store/lua/commit.lua"
MUTANTS: dict[str, list[tuple[str, str, str]]] = {
    "no-fence": [
        (COMMIT, "if refusal then return {0, refusal[1], refusal[2], stored} end\n",
         "-- mutant: no token check\n"),
        (COMMIT, "if stored ~= ARGV[3] then return {0, 'cursor-moved', current, stored} end\n", ""),
        (COMMIT, "local last, last_padded = stored, padded(stored)\n",
         "local last, last_padded = ARGV[3], padded(ARGV[3])\n"),
    ],
}  # fmt: skip


def build(name: str, dest: Path) -> Path:
    """A copy of the nodes' code with mutant ``name`` applied, in ``dest``; returns ``dest``.

    Raises:
        KeyError: no such mutant.
        ValueError: an edit did not apply exactly once.
    """
    edits = MUTANTS[name]
    for package in ("actors", "ingestion"):
        shutil.copytree(ROOT / package, dest / package, ignore=shutil.ignore_patterns("__pycache__"))
    for path, old, new in edits:
        target = dest / path
        text = target.read_text()
        if text.count(old) != 1:
            raise ValueError(
                f"mutant {name}: {path} holds {text.count(old)} copies of {old.strip()!r}, not 1"
            )
        target.write_text(text.replace(old, new))
    return dest
