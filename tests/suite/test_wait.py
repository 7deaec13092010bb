"""The testing kit's one wait (:func:`ingestion.testing.wait.wait_until`), which every test that polls
calls instead of a loop of its own: a plain check or an async one (a request), the value returned,
and a bound that says what never happened."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from ingestion.testing.wait import wait_until


async def test_an_async_check_is_awaited_until_it_holds(autojump_clock: trio.testing.MockClock) -> None:
    asked: list[float] = []

    async def served() -> int:
        await trio.sleep(0.01)  # as a request takes its time
        asked.append(trio.current_time())
        return len(asked) if len(asked) >= 3 else 0

    assert await wait_until(served, 5, what="the third answer", every=0.5) == 3
    assert len(asked) == 3


async def test_a_check_that_never_holds_says_what_never_happened(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async def never() -> bool:
        return False

    with pytest.raises(AssertionError, match=r"^waited 2 s for the ledger served, in vain$"):
        await wait_until(never, 2, what="the ledger served")
    assert await wait_until(lambda: "plain", 1, what="a plain check") == "plain"
