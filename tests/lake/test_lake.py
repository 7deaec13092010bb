"""The data lake: object keys as the Go datastore schema derives them, events as Stellar RPC
derives them (checked on real ledger metadata), and the follower's decisions."""

from __future__ import annotations

import collections
import multiprocessing
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import structlog
import trio
import zstandard
from stellar_sdk import xdr

from actors.source import SourceFatalError, Watermark
from ingestion.lake import decoding
from ingestion.lake.decoding import DECODE_ATTEMPTS, PARENT_WATCH, open_decoders
from ingestion.lake.events import (
    LakeFormatError,
    LedgerEvents,
    batch_events,
    compile_walks,
    ledger_events,
    object_events,
    read_batch,
)
from ingestion.lake.follower import LakeFollower
from ingestion.lake.keys import LakeSchema, ManifestError, parse_name
from ingestion.lake.source import LakeSource
from ingestion.lake.store import LocalLake, check_lake_url
from ingestion.rpc.protocol import OP_MASK, TX_MASK, Cursor, EventFilter, topic_from_text
from ingestion.testing import recorded
from ingestion.testing.wait import alive, wait_until
from tests.support.lakes import (
    batch_bytes,
    die_always,
    die_once,
    every_real_ledger,
    ids_until,
    ledger_seq,
    older_versions,
    real_ledger,
    resequenced,
    standalone_ledgers,
    write_lake,
)

REAL_OBJECT = "go_compressxdr_FCD285FF--53312000.xdr.zstd"

# -- keys -----------------------------------------------------------------------------------------


def test_keys_of_the_public_lake_layout() -> None:
    pubnet = LakeSchema(ledgers_per_file=1, files_per_partition=64_000)
    assert pubnet.object_key(53_312_000) == "FCD285FF--53312000-53375999/FCD285FF--53312000.xdr.zst"
    assert pubnet.object_key(53_312_001) == "FCD285FF--53312000-53375999/FCD285FE--53312001.xdr.zst"
    assert pubnet.object_key(63_999) == "FFFFFFFF--0-63999/FFFF0600--63999.xdr.zst"
    assert pubnet.object_key(64_000, "zstd") == "FFFF05FF--64000-127999/FFFF05FF--64000.xdr.zstd"


def test_keys_of_multi_ledger_files_and_unpartitioned_lakes() -> None:
    schema = LakeSchema(ledgers_per_file=64, files_per_partition=10)
    assert schema.object_key(1000) == "FFFFFD7F--640-1279/FFFFFC3F--960-1023.xdr.zst"
    assert (schema.file_start(1000), schema.file_end(1000)) == (960, 1023)
    flat = LakeSchema(ledgers_per_file=1, files_per_partition=1)
    assert flat.object_key(5) == "FFFFFFFA--5.xdr.zst"


def test_names_read_back_and_a_lying_prefix_is_refused() -> None:
    got = parse_name("FCD285FF--53312000.xdr.zstd")
    assert got is not None and (got.start, got.end, got.extension) == (53_312_000, 53_312_000, "zstd")
    partition = parse_name("FCD285FF--53312000-53375999")
    assert partition is not None and partition.extension is None and partition.end == 53_375_999
    assert parse_name("FCD28500--53312000.xdr.zst") is None
    assert parse_name(".config.json") is None


def test_manifest_round_trip_and_its_errors() -> None:
    schema = LakeSchema(8, 100, network_passphrase="Test SDF Network ; September 2015")
    assert LakeSchema.from_manifest(schema.to_manifest()) == schema
    with pytest.raises(ManifestError, match="ledgersPerBatch"):
        LakeSchema.from_manifest(b'{"batchesPerPartition": 1}')
    with pytest.raises(ManifestError, match="compression 'gzip'"):
        LakeSchema.from_manifest(b'{"ledgersPerBatch": 1, "batchesPerPartition": 1, "compression": "gzip"}')


def test_lake_urls() -> None:
    assert check_lake_url("/data/lake") is None and check_lake_url("file:///data/lake") is None
    assert check_lake_url("s3://bucket/prefix") is None
    assert "s3://BUCKET/PREFIX" in (check_lake_url("http://x/") or "")


# -- events from real ledger metadata -------------------------------------------------------------


async def test_the_real_object_is_found_through_the_key_scheme(tmp_path: Path) -> None:
    real = recorded.require_lake(REAL_OBJECT)
    schema = LakeSchema(1, 64_000)
    (tmp_path / ".config.json").write_bytes(schema.to_manifest())
    target = tmp_path / schema.object_key(53_312_000, "zstd")
    target.parent.mkdir()
    shutil.copy(real, target)
    lake = LocalLake.from_url(f"file://{tmp_path}")
    key, data = await lake.read_ledger(schema, 53_312_000)
    assert key.endswith(REAL_OBJECT.removeprefix("go_compressxdr_")) and data is not None
    assert await lake.edges() == (53_312_000, 53_312_000)
    (ledger,) = object_events(data)  # protocol 21, TransactionMeta V3: 21 diagnostic events only
    assert (ledger.ledger, ledger.protocol, ledger.events) == (53_312_000, 21, ())


@pytest.mark.parametrize(
    ("name", "protocol", "counts"),
    [
        # (name, protocol, {(stage, type): count}) counted from the files themselves
        ("wallet-backend_ledger-51000294.xdr.gz", 20, {"before": 541, "op": 430, "after_tx": 1}),
        ("wallet-backend_ledger-57500008.xdr.gz", 22, {"before": 264, "op": 189, "after_tx": 48}),
        ("wallet-backend_ledger-63092988.xdr.gz", 26, {"before": 228, "op": 311, "after_all": 26}),
    ],
)
def test_events_of_real_ledgers_follow_rpcs_id_rules(
    name: str, protocol: int, counts: dict[str, int]
) -> None:
    meta = real_ledger(name)
    got = ledger_events(meta)
    assert got.protocol == protocol and got.ledger == ledger_seq(meta)
    ids = [e.id for e in got.events]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    assert [Cursor.parse(i) for i in ids] == [e.cursor for e in got.events]

    def stage(c: Cursor) -> str:
        if c.tx == 0:
            return "before"
        if c.tx == TX_MASK:
            return "after_all"
        return "after_tx" if c.op == OP_MASK else "op"

    assert dict(collections.Counter(stage(e.cursor) for e in got.events)) == counts
    assert {e.type for e in got.events} == {"contract"}  # no diagnostic events, no system ones here
    # BeforeAllTxs (fees): one per transaction, (ledger, 0, 0, i) with i counting the ledger
    before = [e.cursor for e in got.events if e.cursor.tx == 0]
    assert [c.event for c in before] == list(range(len(before)))
    # per transaction, the operation events count from 0 within each operation
    per_op = collections.defaultdict(list)
    for e in got.events:
        if 0 < e.cursor.tx < TX_MASK and e.cursor.op != OP_MASK:
            per_op[(e.cursor.tx, e.cursor.op)].append(e.cursor.event)
    assert all(v == list(range(len(v))) for v in per_op.values())
    first = got.events[0]
    assert first.body.startswith(f'{{"type":"contract","ledger":{got.ledger},"ledgerClosedAt":"')
    assert '"operationIndex":0,"transactionIndex":0,"txHash":"' in first.body


def test_a_failed_transactions_fee_event_is_not_in_a_successful_call() -> None:
    got = ledger_events(real_ledger("wallet-backend_ledger-63092990.xdr.gz"))
    flags = {'"inSuccessfulContractCall":false' in e.body for e in got.events}
    assert flags == {True, False}


def test_a_standalone_v23_ledger_has_a_thousand_contract_events_in_order() -> None:
    ledgers = {ledger_seq(m): ledger_events(m) for m in standalone_ledgers()}
    assert sorted(ledgers) == [84, 85, 88]
    for seq in (85, 88):
        events = ledgers[seq].events
        assert len(events) == 1000 and {e.cursor.tx for e in events} == set(range(1, 101))
        assert [e.id for e in events] == sorted(e.id for e in events)


def test_a_corrupt_object_is_a_format_error() -> None:
    with pytest.raises(LakeFormatError, match="not a zstd object"):
        object_events(b"definitely not zstd")
    import zstandard

    with pytest.raises(LakeFormatError, match="LedgerCloseMetaBatch"):
        object_events(zstandard.ZstdCompressor().compress(b"\x00\x00\x00\x01garbage"))


# -- the partial decode: what events need, the rest walked past ------------------------------------


def _batch(metas: list[xdr.LedgerCloseMeta]) -> bytes:
    """An uncompressed ``LedgerCloseMetaBatch`` of ``metas`` (consecutive ledgers)."""
    first, last = xdr.Uint32(ledger_seq(metas[0])), xdr.Uint32(ledger_seq(metas[-1]))
    return bytes(xdr.LedgerCloseMetaBatch(first, last, metas).to_xdr_bytes())


def _full(raw: bytes) -> list[LedgerEvents]:
    """stellar-sdk's whole decode of the batch, then the events: the reference."""
    return [ledger_events(m) for m in read_batch(raw)[2]]


def test_the_walks_compile_with_the_installed_stellar_sdk(monkeypatch: pytest.MonkeyPatch) -> None:
    # else object_events falls back, silently, to stellar-sdk's whole decode (right but slower)
    assert compile_walks()
    data = recorded.require_lake(REAL_OBJECT).read_bytes()
    fast = object_events(data)
    monkeypatch.setattr("ingestion.lake.events._skips", lambda: None)
    assert not compile_walks() and object_events(data) == fast


def test_the_walks_step_over_whole_real_ledgers_and_compile_for_every_sdk_type() -> None:
    from ingestion.lake.skip import skippers

    walk = skippers("LedgerCloseMeta")["LedgerCloseMeta"]
    for meta in every_real_ledger():
        for variant in (meta, older_versions(meta)):
            raw = bytes(variant.to_xdr_bytes())
            assert walk(raw + b"more", 0) == len(raw), ledger_seq(meta)
    # every XDR type of the installed stellar-sdk compiles (the overlay's AuthenticatedMessage
    # switches on a typedef's field, which the ledger never holds)
    names = [n for n in dir(xdr) if n[:1].isupper() and hasattr(getattr(xdr, n), "unpack")]
    names = [n for n in names if n not in ("Opaque", "String", "AuthenticatedMessage")]
    assert len(names) > 400 and len(skippers(*names)) == len(names)


def test_the_partial_decode_equals_the_full_decode_on_every_real_ledger() -> None:
    # every real ledger (LCM V1 and V2, TransactionMeta V3 and V4), and each rewritten with every
    # older version (TransactionMeta V0 to V3 among its transactions; as LCM V0 too)
    real = every_real_ledger()
    variants = real + [older_versions(m, as_v0) for m in real for as_v0 in (False, True)]
    total = 0
    for meta in variants:
        raw = _batch([meta])
        fast, full = batch_events(raw), _full(raw)
        assert fast == full, f"ledger {ledger_seq(meta)} (LCM V{meta.v})"
        assert [(e.id, e.body) for le in fast for e in le.events] == [
            (e.id, e.body) for le in full for e in le.events
        ]
        total += sum(len(le.events) for le in fast)
    assert total > 8_000
    # all of them in one batch (renumbered): the walk ends each ledger where the next begins, so
    # the batch reads as its ledgers one by one (each of which equals the full decode, above;
    # decoding the whole batch fully once more doubled this test's time for nothing more)
    renumbered = [resequenced(m, 1_000 + i) for i, m in enumerate(variants)]
    fast = batch_events(_batch(renumbered))
    assert fast == [le for m in renumbered for le in batch_events(_batch([m]))]
    assert [le.ledger for le in fast] == list(range(1_000, 1_000 + len(variants)))


def test_an_unknown_version_or_arm_is_a_format_error_of_both_decodes() -> None:
    meta = real_ledger("wallet-backend_ledger-63092988.xdr.gz")  # LCM V2, TransactionMeta V4
    body, raw = meta.v2, _batch([meta])
    first = body.tx_processing[0]
    # offsets from stellar-sdk's own encoding of each part before the one changed
    at_meta = 12  # start, end, count
    at_tx = at_meta + 4 + sum(len(p.to_xdr_bytes()) for p in (body.ext, body.ledger_header, body.tx_set)) + 4
    at_fee = at_tx + len(first.ext.to_xdr_bytes()) + len(first.result.to_xdr_bytes())
    at_tx_meta = at_fee + len(first.fee_processing.to_xdr_bytes())
    change = first.fee_processing.ledger_entry_changes[0]
    assert change.type != xdr.LedgerEntryChangeType.LEDGER_ENTRY_REMOVED  # a LedgerEntry follows
    at_entry_type = at_fee + 4 + 4 + 4  # count, change type, lastModifiedLedgerSeq
    for at, value, message in [
        (at_meta, 3, "LedgerCloseMeta V3 is not known"),
        (at_tx_meta, 5, r"TransactionMeta V5 \(transaction 1\) is not known"),
        (at_entry_type, 99, "LedgerEntryType 99 is not known"),  # deep in a skipped change
    ]:
        changed = raw[:at] + struct.pack(">i", value) + raw[at + 4 :]
        with pytest.raises(LakeFormatError, match=message):
            batch_events(changed)
        with pytest.raises(LakeFormatError):
            _full(changed)
    with pytest.raises(LakeFormatError, match="trailing 4 bytes"):
        batch_events(raw + bytes(4))
    with pytest.raises(LakeFormatError, match="not an XDR LedgerCloseMetaBatch"):
        batch_events(raw[: len(raw) // 2])
    with pytest.raises(LakeFormatError, match=r"batch 1-1 holds ledgers \[63092988\]"):
        batch_events(struct.pack(">II", 1, 1) + raw[8:])


async def test_an_unknown_transaction_meta_stops_with_one_line_naming_ledger_and_object(
    tmp_path: Path,
) -> None:
    meta = resequenced(real_ledger("wallet-backend_ledger-63092988.xdr.gz"), 85)
    schema = write_lake(tmp_path, [*standalone_ledgers()[:1], meta])  # 84, then 85
    body = meta.v2
    first = body.tx_processing[0]
    at = 12 + 4 + sum(len(p.to_xdr_bytes()) for p in (body.ext, body.ledger_header, body.tx_set)) + 4
    at += sum(len(p.to_xdr_bytes()) for p in (first.ext, first.result, first.fee_processing))
    raw = _batch([meta])
    changed = raw[:at] + struct.pack(">i", 5) + raw[at + 4 :]
    (tmp_path / schema.object_key(85)).write_bytes(zstandard.ZstdCompressor().compress(changed))
    source = LakeSource(str(tmp_path), poll_interval=0.05)
    with pytest.raises(SourceFatalError) as caught:
        async with source.stream("84") as batches:
            async for _ in batches:
                pass
    message = str(caught.value)
    assert "lake object FFFFFFFF--0-63999/FFFFFFAA--85.xdr.zst (ledger 85)" in message
    assert "TransactionMeta V5 (transaction 1) is not known" in message and "\n" not in message


# -- the follower ---------------------------------------------------------------------------------


def test_follower_positions_and_gaps() -> None:
    metas = {ledger_seq(m): ledger_events(m) for m in standalone_ledgers()}
    f = LakeFollower((), "85")
    assert f.needed == 85
    batch = f.on_ledgers([metas[85]])
    assert batch is not None and len(batch.records) == 1000 and batch.through == str(Cursor.through(85))
    assert batch.watermark == Watermark(85)  # (issue 49) every event of ledger 85 read
    assert f.needed == 86 and f.on_missing(85) is None  # the tip
    gap = f.on_missing(88)
    assert gap is not None and (gap.ledger, gap.latest) == (86, 88)
    # resuming after an event inside a ledger re-reads that ledger, from after the event
    middle = metas[85].events[499].id
    g = LakeFollower((), middle)
    assert g.needed == 85
    resumed = g.on_ledgers([metas[84], metas[85]])
    assert resumed is not None and [r.paging_token for r in resumed.records] == [
        e.id for e in metas[85].events[500:]
    ]


def test_follower_filters_as_rpc_does() -> None:
    ledger = ledger_events(real_ledger("wallet-backend_ledger-63092988.xdr.gz"))
    fee = EventFilter(types=("contract",), topics=(topic_from_text("sym:fee,**"),))
    f = LakeFollower((fee,), str(ledger.ledger))
    batch = f.on_ledgers([ledger])
    assert batch is not None
    expected = [e.id for e in ledger.events if e.topics and e.topics[0] == fee.topics[0][0]]
    assert [r.paging_token for r in batch.records] == expected and len(expected) == 228 + 26


# -- the source ------------------------------------------------------------------------------------


async def test_lake_source_reads_in_order_then_stops_at_a_hole(tmp_path: Path) -> None:
    write_lake(tmp_path, standalone_ledgers())  # 84, 85, 88: 86 and 87 missing
    source = LakeSource(str(tmp_path), poll_interval=0.05, commit_max_records=300)
    assert await source.resolve_start("now") == str(Cursor.through(88))
    got = []
    with pytest.raises(SourceFatalError, match=r"no object .* for ledger 86 but holds ledgers up to 88"):
        async with source.stream("0") as batches:
            async for batch in batches:
                got.append(batch)
    assert [len(b.records) for b in got] == [0, 300, 300, 300, 100]
    assert got[0].through == str(Cursor.through(84)) and got[-1].through == str(Cursor.through(85))


async def test_lake_source_waits_at_the_tip_for_the_next_object(tmp_path: Path) -> None:
    metas = {ledger_seq(m): m for m in standalone_ledgers()}
    write_lake(tmp_path, [metas[84]])
    source = LakeSource(f"file://{tmp_path}", poll_interval=0.05)
    async with source.stream(str(Cursor.through(84))) as batches:
        await trio.sleep(0.2)
        write_lake(tmp_path, [metas[85]])
        with trio.fail_after(10):
            batch = await batches.receive()
    assert batch.records[0].paging_token.startswith(str(Cursor(85, 1)).split("-")[0])


async def test_a_corrupt_object_stops_with_one_line_naming_ledger_and_object(tmp_path: Path) -> None:
    metas = standalone_ledgers()
    schema = write_lake(tmp_path, metas[:2])
    (tmp_path / schema.object_key(85)).write_bytes(b"\x28\xb5\x2f\xfdbroken")
    source = LakeSource(str(tmp_path), poll_interval=0.05)
    with pytest.raises(
        SourceFatalError, match=r"lake object FFFFFFFF--0-63999/FFFFFFAA--85.xdr.zst \(ledger 85\)"
    ):
        async with source.stream("84") as batches:
            async for _ in batches:
                pass


async def test_worker_processes_decode_in_order_and_none_outlives_its_stream(tmp_path: Path) -> None:
    write_lake(tmp_path, standalone_ledgers()[:2])  # 84, 85, then the tip
    in_thread = await ids_until(LakeSource(str(tmp_path), decode_processes=0), 85)
    two = LakeSource(str(tmp_path), decode_processes=2, read_ahead=3, poll_interval=0.05)
    assert await ids_until(two, 85) == in_thread and len(in_thread) == 1000
    assert multiprocessing.active_children() == []
    await ids_until(two, 84)  # leaves while 85 may still be decoding: the worker is killed
    assert multiprocessing.active_children() == []


def test_a_decode_cancelled_while_its_worker_answers_leaves_nothing_to_wait_for() -> None:
    """A term ending while a worker sends its answer (a SIGTERM during a catch-up) kills that
    worker at once, and the node's process still exits: with ProcessPoolExecutor, a worker
    terminated mid-answer left its manager thread waiting for the rest forever, and the
    interpreter joins that thread at exit (a node handed its lease over, then never exited)."""
    fractions = (0.0, 0.2, 0.4, 0.6, 0.8)
    code = (
        "import trio; from tests.support.lakes import cancel_decodes_while_answering as run; "
        f"trio.run(run, {fractions!r})"
    )
    try:
        done = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
            cwd=Path(__file__).parents[2],
        )  # fmt: skip
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the process did not exit within 60 s; it printed:\n{exc.stdout}{exc.stderr}")
    lines = done.stdout.splitlines()
    assert done.returncode == 0 and lines[-1] == "done", done.stdout + done.stderr
    runs = lines[1:-1]
    cancelled = [run for run in runs if "cancelled, " in run]
    assert len(runs) == len(fractions) and len(cancelled) >= 2, done.stdout
    assert all(run.endswith("0 after the exit") for run in runs), done.stdout
    assert all(run.endswith("0 workers alive then, 0 after the exit") for run in cancelled), done.stdout


async def test_a_decode_worker_whose_node_was_killed_mid_decode_exits_by_itself(tmp_path: Path) -> None:
    """No PR_SET_PDEATHSIG here (trio-parallel starts workers from trio's cached threads, and the
    signal follows the thread): the worker watches its parent, and leaves when orphaned."""
    marker = tmp_path / "worker-pid"
    code = (
        "import trio; from tests.support.lakes import decode_forever; "
        f"trio.run(decode_forever, {str(marker)!r})"
    )
    node = await trio.lowlevel.open_process([sys.executable, "-c", code], cwd=Path(__file__).parents[2])
    try:
        await wait_until(lambda: marker.exists() and marker.read_text(), 30, what="the decode to start")
        worker = int(marker.read_text())
        assert alive(worker)
    finally:
        node.kill()
        await node.wait()
    await wait_until(lambda: not alive(worker), PARENT_WATCH + 2, what="the orphaned worker to exit")


async def test_a_cancellation_goes_on_past_a_worker_that_died_while_idle() -> None:
    """The exit complains of a worker that died (here SIGKILLed while idle): logged, never put in
    place of the cancellation that ended the stream."""
    data = batch_bytes(standalone_ledgers()[:1])
    with structlog.testing.capture_logs() as logs, trio.CancelScope() as scope:
        async with open_decoders(1) as decoders:
            assert len(await decoders.decode(data)) == 1
            (worker,) = multiprocessing.active_children()
            worker.kill()
            worker.join()
            scope.cancel()
            await trio.lowlevel.checkpoint()  # the cancellation is delivered here
    assert scope.cancelled_caught
    assert [e["event"] for e in logs] == ["lake-decoder-unclean-exit"]
    assert multiprocessing.active_children() == []


async def test_a_decode_whose_worker_was_killed_is_done_again_on_a_fresh_worker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(decoding, "object_events", die_once)
    with structlog.testing.capture_logs() as logs:
        async with open_decoders(1) as decoders:
            assert await decoders.decode(str(tmp_path / "died").encode()) == []
    assert [(e["event"], e["attempt"]) for e in logs] == [("lake-decoder-died", 1)]
    assert "killed by signal 9" in logs[0]["error"]


async def test_an_object_whose_worker_dies_every_time_stops_the_job_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An object that kills its worker (the OOM killer, every time): a clear stop, not a crash."""
    write_lake(tmp_path, standalone_ledgers()[:1])
    monkeypatch.setattr(decoding, "object_events", die_always)
    source = LakeSource(str(tmp_path), poll_interval=0.05)
    with structlog.testing.capture_logs() as logs, pytest.raises(
        SourceFatalError, match=r"\(ledger 84\) .* its decode worker died 3 times: .*killed by signal 9"
    ):
        async with source.stream("0") as batches:
            async for _ in batches:
                pass
    died = [e["attempt"] for e in logs if e["event"] == "lake-decoder-died"]
    assert died == list(range(1, DECODE_ATTEMPTS))
    assert multiprocessing.active_children() == []


# -- configuration ---------------------------------------------------------------------------------


def test_a_lake_job_takes_the_rpc_filter_and_a_lake_url() -> None:
    from ingestion.config import ConfigError, Settings

    settings = Settings.from_mapping({
        "node": {"source": "lake"}, "lake": {"url": "/data/lake"},
        "rpc": {"topics": ["sym:transfer,**"], "start_cursor": "0"},
    })  # fmt: skip
    (job,) = settings.jobs
    assert (job.name, job.kind, job.lake_url, job.start_cursor, job.rpc_urls) == (
        "lake",
        "lake",
        "/data/lake",
        "0",
        (),
    )
    assert job.rpc_filters()[0].topics == (topic_from_text("sym:transfer,**"),)
    s3 = Settings.from_mapping({"jobs": {"s3": {"kind": "lake", "lake": "s3://bucket/p"}}})
    assert s3.jobs[0].lake_url == "s3://bucket/p"
    with pytest.raises(ConfigError, match="names a bucket"):
        Settings.from_mapping({"jobs": {"old": {"kind": "lake", "lake": "s3:///p"}}})
    with pytest.raises(ConfigError, match=r"lake\.url: no lake URL given"):
        Settings.from_mapping({"node": {"source": "lake"}})
