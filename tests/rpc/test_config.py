"""RPC jobs in the settings: flags, [rpc], [jobs.NAME] tables, and filters checked before start."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ingestion.cli.run import parser as _run_parser
from ingestion.cli.usage import settings_of_flags
from ingestion.config import ConfigError, Settings, load
from ingestion.decode.stage import EventsStage
from ingestion.rpc.protocol import EventFilter, parse_start, segment_from_text

CONTRACT = "CDLZFC3SYJYDZT7K67VZ75HPJVIEUVNIXF47ZG2FB2RMQQVU2HHGCYSC"


def settings_from(argv: list[str]) -> Settings:
    return load(None, {}, settings_of_flags(_run_parser().parse_args(argv)))


def test_flags_make_one_rpc_job_with_one_filter() -> None:
    s = settings_from([
        "--source", "rpc", "--rpc", "http://127.0.0.1:9", "--rpc", "http://127.0.0.1:10",
        "--event-type", "contract", "--contract-id", CONTRACT, "--topic", "sym:transfer,*,**",
        "--start-cursor", "123",
    ])  # fmt: skip
    (job,) = s.jobs
    assert job.kind == "rpc" and job.rpc_urls == ("http://127.0.0.1:9", "http://127.0.0.1:10")
    assert job.start_cursor == "123"
    assert job.rpc_filters() == (
        EventFilter(("contract",), (CONTRACT,), ((segment_from_text("sym:transfer"), "*", "**"),)),
    )


def test_job_tables_mix_horizon_and_rpc_jobs() -> None:
    s = Settings.from_mapping({
        "rpc": {"urls": ["http://127.0.0.1:9"]},
        "jobs": {
            "ops": {"resource": "/operations"},
            "transfers": {"kind": "rpc", "topics": ["sym:transfer,**"], "start_cursor": "0"},
            "all-events": {"kind": "rpc", "rpc": ["http://127.0.0.1:11"]},
        },
    })  # fmt: skip
    kinds = {j.name: j.kind for j in s.jobs}
    assert kinds == {"ops": "horizon", "transfers": "rpc", "all-events": "rpc"}
    transfers = next(j for j in s.jobs if j.name == "transfers")
    assert transfers.rpc_urls == ("http://127.0.0.1:9",) and transfers.start_cursor == "0"
    everything = next(j for j in s.jobs if j.name == "all-events")
    assert everything.rpc_filters() == () and everything.rpc_urls == ("http://127.0.0.1:11",)


@pytest.mark.parametrize(
    ("argv", "problem"),
    [
        (["--contract-id", CONTRACT] * 6, "rpc.contract_ids: maximum 5 contract IDs per filter"),
        (["--contract-id", "GABC"], "rpc.contract_ids: contract ID 1 invalid"),
        (["--topic", "*"] * 6, "rpc.topics: maximum 5 topics per filter"),
        (["--topic", "**,*"], "rpc.topics: topic 1 invalid: segment 1 invalid: wildcard '**' is only"),
        (["--topic", "*,*,*,*,*"], "rpc.topics: topic 1 invalid: topic cannot have more than 4 segments"),
        (["--topic", "sym:transfer,u32:-1"], "rpc.topics: bad u32: segment '-1'"),
        (["--start-cursor", "abc"], "rpc.start_cursor: must be now, 0, a ledger number or an event id"),
        (["--rpc", "ftp://x"], "rpc.urls: not an http(s) URL"),
    ],
)
def test_bad_filters_and_settings_are_configuration_errors(argv: list[str], problem: str) -> None:
    with pytest.raises(ConfigError) as err:
        settings_from(["--source", "rpc", *argv])
    assert any(p.startswith(problem) for p in err.value.problems), err.value.problems


@pytest.mark.parametrize(
    "start",
    ["now", "0", "1", "2147483647", "2147483648", " 5 ", "\u00b2", "-1", "0000000000000004096-0000000001",
     "4096-1-1", "abc"],
)  # fmt: skip
def test_the_config_takes_the_start_cursors_the_followers_read(start: str) -> None:
    """A start cursor is read one way (``parse_start``, the RPC and lake followers'): the config
    accepts what they read and refuses, as a configuration error, what they cannot."""
    try:
        parse_start(start, "an RPC")
        readable = True
    except ValueError:
        readable = start == "now"
    try:
        rpc = {"urls": ["http://127.0.0.1:9"], "start_cursor": start}
        Settings.from_mapping({"node": {"source": "rpc"}, "rpc": rpc})
        accepted = True
    except ConfigError:
        accepted = False
    assert accepted == readable


def test_topics_from_the_environment_are_separated_by_semicolons() -> None:
    s = load(None, {"INGESTION_NODE_SOURCE": "rpc", "INGESTION_RPC_TOPICS": "sym:transfer,**;sym:mint"}, {})
    assert s.jobs[0].topics == ("sym:transfer,**", "sym:mint")


def test_a_bad_filter_exits_2_with_one_line_naming_it() -> None:
    run = subprocess.run(
        [sys.executable, "-m", "ingestion", "--source", "rpc", "--topic", "**,*", "--redis", "redis://127.0.0.1:1"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert run.returncode == 2
    assert run.stderr.strip().splitlines() == [
        "ingestion: configuration error: rpc.topics: topic 1 invalid: segment 1 invalid: "
        "wildcard '**' is only allowed as the last segment"
    ]


def test_on_history_gap_lake_needs_a_lake_and_builds_an_rpc_source_backed_by_it(tmp_path: Path) -> None:
    from ingestion.lake.source import LakeSource
    from ingestion.node.build import build_source
    from ingestion.rpc.source import RpcSource

    env = {"INGESTION_NODE_SOURCE": "rpc", "INGESTION_RPC_ON_HISTORY_GAP": "lake"}
    with pytest.raises(ConfigError) as err:
        load(None, env, {})
    assert any(p.startswith("rpc.lake: no lake URL given") for p in err.value.problems), err.value.problems
    s = load(
        None,
        {**env, "INGESTION_RPC_LAKE": f"file://{tmp_path}", "INGESTION_RPC_TOPICS": "sym:transfer,**"},
        {},
    )
    staged = build_source(s)
    assert isinstance(staged, EventsStage)  # decoding is on by default: the events stage wraps it
    source = staged.inner
    assert isinstance(source, RpcSource) and isinstance(source.history, LakeSource)
    assert source.history.filters == source.filters and source.on_history_gap == "lake"
    with pytest.raises(ValueError, match="needs a lake"):
        RpcSource("http://127.0.0.1:9", on_history_gap="lake")
