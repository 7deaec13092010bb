"""What ``ingestion backfill`` checks before it writes a plan: each problem one line, and nothing
written (exit 2). The span must be within the source's reach (a lake: every object of the span
present, the missing ones named; Stellar RPC: its retention window) and must end before the
job's own committed records begin (a backfill fills history below a live job; the two then meet
without a gap or a duplicate)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from ingestion.lake.keys import LakeSchema, parse_name

MAX_NAMED = 5  # missing objects named in the line (then "and N more")


def span_keys(schema: LakeSchema, first: int, last: int) -> list[tuple[str, str, int]]:
    """(partition, file name without extension, first ledger) of every object holding a ledger
    of ``first..last``, in order."""
    out = []
    ledger = schema.file_start(first)
    while ledger <= last:
        name = schema.file_name(ledger)
        out.append((schema.partition(ledger), name.rsplit(".xdr.", 1)[0], ledger))
        ledger += schema.ledgers_per_file
    return out


def missing_objects(
    schema: LakeSchema, first: int, last: int, names_in: Callable[[str], Iterable[str]]
) -> list[str]:
    """The keys (with the schema's extension) of the span's objects the lake lacks, under any
    extension; ``names_in(partition)`` lists a partition's entries (one listing per partition)."""
    listed: dict[str, set[str]] = {}
    missing = []
    for partition, stem, ledger in span_keys(schema, first, last):
        if partition not in listed:
            listed[partition] = {
                n.rsplit(".xdr.", 1)[0] for n in names_in(partition) if parse_name(n.rstrip("/")) is not None
            }
        if stem not in listed[partition]:
            missing.append(schema.object_key(ledger))
    return missing


def describe_missing(lake: str, missing: list[str]) -> str:
    named = ", ".join(missing[:MAX_NAMED])
    more = f" and {len(missing) - MAX_NAMED} more" if len(missing) > MAX_NAMED else ""
    return f"the lake {lake} lacks {len(missing)} object(s) of the span: {named}{more}"


def overlap_problem(job: str, first: int, last: int, committed: tuple[int, int] | None) -> str | None:
    """A span that reaches into ``job``'s committed span or past it (``committed``: its first
    and last ledger with records or a cursor; None: nothing committed) is refused: the job
    itself reads what comes after its cursor."""
    if committed is None:
        return None
    low, high = committed
    if last >= low:
        return (
            f"ledgers {first}..{last} overlap job {job}'s committed span (ledgers {low}..{high}): "
            f"a backfill fills history below the job; give --to {low - 1} or lower"
        )
    return None
