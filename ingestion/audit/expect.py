"""What a job must hold, recomputed from lake objects: no I/O (the per-object work runs in the lake's
decode workers, :meth:`ingestion.lake.decoding.Decoders.run`).

A lake job's records are the lake's events (:func:`ingestion.lake.events.object_events`: ids and
JSON exactly as Stellar RPC serves them) that match the job's ``getEvents`` filters, each passed
through the job's rule (:func:`ingestion.decode.decoded.decode_event_text`: decoded fields added,
and the addresses it names) and kept when the job's watch list names one of them: the same pure
rules the node's events stage applies (:mod:`ingestion.decode.stage`), applied here to the source
read again, not to anything the node wrote. An RPC job's records are the same events (the lake is
RPC's history), so the same expectation holds for it.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from ingestion.lake.events import object_events
from ingestion.rpc.protocol import EventFilter, matches

Expected = tuple[str, str, tuple[str, ...]]
"""An event the job keeps if its watch list allows: (id, text as committed, addresses it names)."""


@attrs.frozen
class Rules:
    """How a job turns the source's events into its records (picklable: sent to the workers)."""

    filters: tuple[EventFilter, ...] = ()
    decode: bool = True  # committed decoded (``decode``), or as the source serves them
    names: bool = False  # the addresses are needed (the job has a watch list)


def object_expectation(
    data: bytes, rules: Rules, first: int, last: int
) -> tuple[tuple[int, ...], list[Expected]]:
    """A compressed lake object's ledgers within ``first..last`` and the events of those ledgers
    the job keeps before its watch list (runs in a decode worker).

    Raises:
        LakeFormatError: the object cannot be read.
    """
    if rules.decode or rules.names:
        # lazy: only rules that decode or name addresses use the decoder
        from ingestion.decode.decoded import decode_event_text
    held: list[int] = []
    out: list[Expected] = []
    for ledger in object_events(data):
        if not first <= ledger.ledger <= last:
            continue
        held.append(ledger.ledger)
        for e in ledger.events:
            if rules.filters and not matches(rules.filters, e.type, e.contract_id, e.topics):
                continue
            if rules.decode or rules.names:
                text, addresses = decode_event_text(e.body)
                out.append((e.id, text if rules.decode else e.body, addresses))
            else:
                out.append((e.id, e.body, ()))
    return tuple(held), out


def uncovered(first: int, last: int, held: Sequence[int]) -> list[int]:
    """The ledgers of ``first..last`` that no object read held (a lake with a hole)."""
    have = set(held)
    return [ledger for ledger in range(first, last + 1) if ledger not in have]


def windows(first: int, last: int, size: int) -> list[tuple[int, int]]:
    """``first..last`` in consecutive windows of ``size`` ledgers (the last one shorter).

    Raises:
        ValueError: an empty span or a size below 1.
    """
    if last < first or size < 1:
        raise ValueError(f"no window of {size} ledgers in {first}..{last}")
    return [(a, min(a + size - 1, last)) for a in range(first, last + 1, size)]
