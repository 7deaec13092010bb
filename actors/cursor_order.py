"""Cursor ordering: the positions a source's records carry, parsed and compared. Pure: no I/O.

A position (a *paging token*) is a non-negative int64 written in decimal, optionally followed by
``-<n>`` (a sub-position, e.g. the n-th effect of a Horizon operation). Horizon writes both parts
without leading zeros; Stellar RPC's event ids are zero-padded to a fixed width
(``"%019d-%010d"``): both compare by value, so leading zeros are allowed and mean nothing. Positions must be
compared as numbers (pairs), never as strings: ``"9" < "10"`` is false as strings. The same rule is
implemented in Lua inside the commit script (``actors/lease_store/lua/commit.lua``), which compares decimal
strings by (length, text) once leading zeros are stripped, because Redis's Lua numbers are doubles
and cannot hold every int64; and in plpgsql inside the PostgreSQL sink's ``commit_batch``
(``ingestion/postgres/sql.py``), as (position, sub-position) pairs of bigints.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Sequence

_TOKEN = re.compile(r"([0-9]{1,19})(?:-([0-9]{1,10}))?")
# Positions without a sub-position, one per line: a whole batch of them checked in one match.
_PLAIN_LINES = re.compile(r"[0-9]{1,19}(?:\n[0-9]{1,19})*")
# Stellar RPC's event ids, ``"%019d-%010d"``, one per line. Two tokens of this one width compare
# as text exactly as they do as pairs: the first character where they differ is a digit of the
# position (then the positions differ there, and equal-width decimals order as their digits do)
# or, positions equal, a digit of the sub-position (likewise); the ``-`` is at the same place.
_PADDED_LINES = re.compile(r"[0-9]{19}-[0-9]{10}(?:\n[0-9]{19}-[0-9]{10})*")
_PADDED_SUB = operator.itemgetter(slice(20, None))
_MAX_POSITION, _MAX_SUB = str((1 << 63) - 1), str((1 << 32) - 1)  # 19 and 10 digits wide


class InvalidPagingToken(ValueError):
    """A position that is neither a decimal int64 nor ``"<int64>-<n>"``."""


def token_key(token: str) -> tuple[int, int]:
    """Return the sort key of a paging token: ``(position, n)``, ``n`` being 0 when absent.

    Raises:
        InvalidPagingToken: the token is not a well-formed paging token.
    """
    m = _TOKEN.fullmatch(token)
    if m is None:
        raise InvalidPagingToken(f"not a paging token: {token!r}")
    position, sub = int(m.group(1)), int(m.group(2) or 0)
    if position >= 1 << 63 or sub >= 1 << 32:
        raise InvalidPagingToken(f"paging token out of range (int64, then uint32): {token!r}")
    return position, sub


def is_after(token: str, previous: str | None) -> bool:
    """True when ``token`` sorts strictly after ``previous`` (anything is after ``None``)."""
    return previous is None or token_key(token) > token_key(previous)


def ascending_after(tokens: Sequence[str], after: str | None = None) -> bool:
    """True when every token is well formed and sorts strictly after the one before it, the first
    strictly after ``after`` (when given; a malformed ``after`` gives False).

    The same rule as :func:`token_key` pair by pair, at a fraction of its cost for a batch of plain
    positions or of Stellar RPC's fixed-width ids (one regular-expression match over them all,
    C-level conversions and comparisons): it runs on every record a node ingests.
    """
    if not tokens:
        return True
    try:
        floor = None if after is None else token_key(after)
        lines = "\n".join(tokens)
        if _PADDED_LINES.fullmatch(lines):
            # Ascending as text is ascending as pairs (see _PADDED_LINES); so the last token has
            # the largest position, and only the sub-positions need a pass for their range.
            if tokens[-1][:19] > _MAX_POSITION or max(map(_PADDED_SUB, tokens)) > _MAX_SUB:
                return False
            if floor is not None and token_key(tokens[0]) <= floor:
                return False
            return all(map(operator.lt, tokens, tokens[1:]))
        if _PLAIN_LINES.fullmatch(lines):
            keys = list(map(int, tokens))
            if keys[-1] >= 1 << 63 or max(keys) >= 1 << 63:
                return False
            if floor is not None and (keys[0], 0) <= floor:
                return False
            return all(map(operator.lt, keys, keys[1:]))
        pairs = [token_key(t) for t in tokens]
    except InvalidPagingToken:
        return False
    if floor is not None and pairs[0] <= floor:
        return False
    return all(map(operator.lt, pairs, pairs[1:]))
