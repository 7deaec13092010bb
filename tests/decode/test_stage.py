"""The events stage: records decoded and filtered by a watch list, the cursor moving past what the
list leaves out, and nothing else of the source changed."""

from __future__ import annotations

import orjson
import trio
import trio.testing

from actors.source import Batch, Record, SyntheticSource
from ingestion.decode.stage import UNAVAILABLE_RETRY, EventsStage, stage_for
from ingestion.watchlist.lists import WatchUnavailable


def _tagged(text: str) -> tuple[str, tuple[str, ...]]:
    """A rule for the tests: a record names account ``A<seq % 3>`` and gets a ``tag`` field."""
    seq = orjson.loads(text)["seq"]
    return text[:-1] + f',"tag":{seq}}}', (f"A{seq % 3}",)


class _Listed:
    def __init__(self, *addresses: str) -> None:
        self.addresses = set(addresses)

    def matches(self, addresses: tuple[str, ...]) -> bool:
        return any(a in self.addresses for a in addresses)


class _Editable:
    """A watch source whose list the test edits between batches."""

    def __init__(self, listed: _Listed) -> None:
        self.listed = listed
        self.asked = 0

    async def current(self) -> _Listed:
        self.asked += 1
        return self.listed

    def describe(self) -> str:
        return "the test's list"


class _Unreadable(_Editable):
    """A watch source with no list for its first ``failures`` asks (Redis unreachable)."""

    def __init__(self, listed: _Listed, failures: int) -> None:
        super().__init__(listed)
        self.failures = failures

    async def current(self) -> _Listed:
        self.asked += 1
        if self.asked <= self.failures:
            raise WatchUnavailable("redis set ingestion:{j}:watch: cannot read it")
        return self.listed


def _batch(*seqs: int, through: str | None = None) -> Batch:
    source = SyntheticSource(total=None)
    return Batch(tuple(source.record(i) for i in seqs), through=through)


def test_decoding_alone_replaces_every_text_and_keeps_the_cursor() -> None:
    stage = EventsStage(SyntheticSource(), _tagged)
    out = stage.apply(_batch(1, 2, 3), None)
    assert [orjson.loads(r.body)["tag"] for r in out.records] == [1, 2, 3]
    assert [r.paging_token for r in out.records] == [r.paging_token for r in _batch(1, 2, 3).records]
    assert out.through is None and out.cursor == _batch(1, 2, 3).cursor


def test_a_watch_list_keeps_only_the_records_naming_a_watched_address() -> None:
    stage = EventsStage(SyntheticSource(), _tagged)
    out = stage.apply(_batch(1, 2, 3, 4, 5, 6), _Listed("A1"))
    assert [orjson.loads(r.body)["seq"] for r in out.records] == [1, 4]
    # the last records were left out: the batch's cursor is kept as a read-through cursor
    assert out.cursor == _batch(6).cursor and out.through == _batch(6).cursor
    assert (stage.seen, stage.kept) == (6, 2)


def test_a_batch_the_list_leaves_empty_still_moves_the_cursor() -> None:
    stage = EventsStage(SyntheticSource(), _tagged)
    out = stage.apply(_batch(3, 6, 9), _Listed("A1"))
    assert out.records == () and out.through == _batch(9).cursor


def test_the_read_through_cursor_of_the_source_survives() -> None:
    stage = EventsStage(SyntheticSource(), _tagged)
    through = SyntheticSource.token_of(20)
    out = stage.apply(_batch(1, 2, 4, through=through), _Listed("A1"))
    assert [orjson.loads(r.body)["seq"] for r in out.records] == [1, 4]
    assert out.through == through


def test_with_decoding_off_the_kept_records_are_the_source_s_own_text() -> None:
    stage = EventsStage(SyntheticSource(), _tagged, decode=False)
    batch = _batch(1, 2, 3, 4)
    out = stage.apply(batch, _Listed("A1"))
    assert out.records == (batch.records[0], batch.records[3])


def test_nothing_to_do_leaves_the_source_unwrapped() -> None:
    source = SyntheticSource()
    assert stage_for(source, None, True, None) is source
    assert stage_for(source, _tagged, False, None) is source
    assert isinstance(stage_for(source, _tagged, False, _Editable(_Listed())), EventsStage)


async def test_the_stream_asks_for_the_list_at_every_batch_and_an_edit_applies_to_the_next() -> None:
    watch = _Editable(_Listed("A1"))
    stage = EventsStage(SyntheticSource(total=12, batch_size=3), _tagged, watch=watch)
    kept: list[list[int]] = []
    cursors: list[str] = []
    async with stage.stream("0") as batches:
        async for batch in batches:
            kept.append([orjson.loads(r.body)["seq"] for r in batch.records])
            cursors.append(batch.cursor)
            if len(kept) == 2:
                watch.listed = _Listed("A2")  # an operator edits the list while the job runs
    assert kept == [[1], [4], [8], [11]]
    assert cursors == [SyntheticSource.token_of(i) for i in (3, 6, 9, 12)]
    assert watch.asked == 4


async def test_the_inner_source_s_other_parts_show_through() -> None:
    source = SyntheticSource(total=5)
    stage = EventsStage(source, _tagged)
    assert stage.batch_size == source.batch_size
    assert await stage.resolve_start("now") == SyntheticSource.token_of(5)
    with trio.fail_after(5):
        async with stage.stream(SyntheticSource.token_of(4)) as batches:
            got = [b async for b in batches]
    assert [r.paging_token for b in got for r in b.records] == [SyntheticSource.token_of(5)]
    assert isinstance(got[0].records[0], Record)


async def test_a_batch_waits_for_a_list_that_cannot_be_loaded_and_is_never_committed_unfiltered(
    autojump_clock: trio.testing.MockClock,
) -> None:
    watch = _Unreadable(_Listed("A1"), failures=3)
    stage = EventsStage(SyntheticSource(total=3, batch_size=3), _tagged, watch=watch)
    began = trio.current_time()
    async with stage.stream("0") as batches:
        got = [b async for b in batches]
    assert trio.current_time() - began == 3 * UNAVAILABLE_RETRY
    assert [[orjson.loads(r.body)["seq"] for r in b.records] for b in got] == [[1]]
    assert got[0].cursor == SyntheticSource.token_of(3)


def test_which_records_a_job_s_decoding_changes() -> None:
    from ingestion.decode.stage import rule_for

    assert rule_for("rpc")[1] and rule_for("lake")[1]
    assert rule_for("horizon", "/payments")[1]
    assert rule_for("horizon", "/accounts/GABC/payments?include_failed=true")[1]
    # an /operations job (the default) keeps its records as sent; its rule still names addresses
    rule, changes = rule_for("horizon", "/operations")
    assert rule is not None and not changes
    assert rule_for("scheduled") == (None, False)
    record = '{"id":"1","type":"payment","from":"%s","to":"%s","amount":"1.0000000","asset_type":"native"}'
    g1 = "GC5LF63GRVIT5ZXXCXLPI3RX2YXKJQFZVBSAO6AUELN3YIMSWPD6Z6FH"
    g2 = "GAFK7XFZHMLSNV7OJTBO7BAIZA66X6QIBV5RMZZYXK4Q7ZSO52J5C3WQ"
    named = rule_for("horizon", "/payments", names=True)[0]
    unnamed = rule_for("horizon", "/payments", names=False)[0]
    assert named is not None and unnamed is not None
    assert named(record % (g1, g2))[1] == (g1, g2)
    assert unnamed(record % (g1, g2)) == (named(record % (g1, g2))[0], ())
