"""The getEvents followers (RPC and a data lake) read a job's start cursor with one rule
(:func:`ingestion.rpc.protocol.parse_start`): the lake once took ledgers up to 2^32 - 1, RPC up
to 2^31 - 1, which is the right bound (an event id's ledger is a non-negative int32)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from ingestion.common.retry import RetryPolicy
from ingestion.lake.follower import LakeFollower
from ingestion.rpc.follower import Phase, RpcFollower
from ingestion.rpc.protocol import MAX_LEDGER, Cursor


def _rpc(start: str) -> RpcFollower:
    return RpcFollower(("http://rpc.invalid",), (), start, RetryPolicy())


def _lake(start: str) -> LakeFollower:
    return LakeFollower((), start)


FOLLOWERS: list[Callable[[str], Any]] = [_rpc, _lake]


@pytest.mark.parametrize("follow", FOLLOWERS)
@pytest.mark.parametrize("start", [str(MAX_LEDGER + 1), str(1 << 32), str((1 << 32) - 1), "-1", "x"])
def test_both_followers_refuse_what_no_event_id_can_name(follow: Callable[[str], Any], start: str) -> None:
    with pytest.raises(ValueError, match=r"out of range|start cursor"):
        follow(start)


@pytest.mark.parametrize("follow", FOLLOWERS)
def test_both_followers_take_the_oldest_a_ledger_and_an_event_id(follow: Callable[[str], Any]) -> None:
    assert follow(" 0 ").position is None
    assert follow(str(MAX_LEDGER)).start_ledger == MAX_LEDGER
    event = Cursor(50_000_020, 1, 0, 0)
    assert follow(str(event)).position == event


def test_the_rpc_follower_starts_in_the_phase_its_cursor_names() -> None:
    assert _rpc("0").phase is Phase.OLDEST
    assert _rpc("7").phase is Phase.LEDGER
    assert _rpc(str(Cursor(7, 0, 0, 0))).phase is Phase.CURSOR
