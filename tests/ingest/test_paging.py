"""Paging tokens compare as numbers (pairs for effects), never as strings."""

from __future__ import annotations

import pytest

from ingestion.common.paging import InvalidPagingToken, is_after, toid, toid_parts, token_key


def test_toids_compare_numerically() -> None:
    assert is_after("10", "9")
    assert not is_after("9", "10")
    assert is_after("12884905985", "8589938689")


def test_effect_tokens_compare_as_pairs() -> None:
    assert is_after("12884905985-10", "12884905985-9")
    assert is_after("12884905986-1", "12884905985-10")
    assert token_key("12884905985") < token_key("12884905985-1")


def test_anything_is_after_nothing_but_nothing_is_after_itself() -> None:
    assert is_after("1", None)
    assert not is_after("5-2", "5-2")


@pytest.mark.parametrize(
    "bad", ["", "-1", "1-", "abc", "1-2-3", "now", " 5", str(1 << 63), "5-4294967296", "0" * 20]
)
def test_malformed_tokens_are_refused(bad: str) -> None:
    with pytest.raises(InvalidPagingToken):
        token_key(bad)


def test_zero_padded_tokens_are_their_values() -> None:
    """Stellar RPC writes event ids zero-padded ("%019d-%010d"): same order as unpadded."""
    assert token_key("0000000000000000042-0000000007") == (42, 7)
    assert token_key("01") == (1, 0)
    assert is_after("0000214748364800001-0000000010", "214748364800001-9")
    assert not is_after("0000214748364800001-0000000009", "214748364800001-9")


def test_toid_round_trip() -> None:
    value = toid(556001, 3, 2)
    assert value == (556001 << 32) | (3 << 12) | 2
    assert toid_parts(value) == (556001, 3, 2)
    with pytest.raises(ValueError):
        toid(1, 1 << 20, 0)
