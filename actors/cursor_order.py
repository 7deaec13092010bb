"""Cursor ordering: the positions a source's records carry, parsed and compared. Pure: no I/O.

A position (a *paging token*) is a non-negative int64 written in decimal, optionally followed by
``-<n>`` (a sub-position, e.g. the n-th effect of a Horizon operation). Horizon writes both parts
without leading zeros; Stellar RPC's event ids are zero-padded to a fixed width
(``"%019d-%010d"``): both compare by value, so leading zeros are allowed and mean nothing. Positions must be
compared as numbers (pairs), never as strings: ``"9" < "10"`` is false as strings. The same rule is
implemented in Lua inside the commit script (``actors/lease_store/lua/commit.lua``), which compares decimal
strings by (length, text) once leading zeros are stripped, because Redis's Lua numbers are doubles
and cannot hold every int64.
"""

from __future__ import annotations

import re

_TOKEN = re.compile(r"([0-9]{1,19})(?:-([0-9]{1,10}))?")


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
