"""The network rules (ingestion/common/network.py), as plain functions: passphrases by name, a
wrong network named in one line, and a reset told from ledger identity."""

from __future__ import annotations

from ingestion.common.network import (
    NETWORKS,
    ResetJudge,
    SourceLook,
    first_passphrase,
    ledger_of,
    passphrase_of,
    wrong_network,
)
from ingestion.common.paging import toid

TESTNET = NETWORKS["testnet"]


def test_a_network_setting_names_a_public_network_or_is_a_passphrase() -> None:
    assert passphrase_of("Testnet") == "Test SDF Network ; September 2015"
    assert passphrase_of("pubnet") == "Public Global Stellar Network ; September 2015"
    assert passphrase_of(" Standalone Network ; February 2017 ") == "Standalone Network ; February 2017"
    assert passphrase_of("") == ""


def test_the_ledger_of_a_cursor_is_its_toids() -> None:
    assert ledger_of(str(toid(1234, 5, 6))) == 1234
    assert ledger_of(f"{toid(77, 1, 0):019d}-{3:010d}") == 77  # an RPC event id
    assert ledger_of(f"{toid(9):d}-2") == 9  # an effect's token
    assert [ledger_of(c) for c in (None, "", "0", "now", "x")] == [None] * 5


def test_a_url_on_another_network_is_named_with_both_passphrases() -> None:
    looks = [
        SourceLook("http://a", TESTNET),
        SourceLook("http://b", None),
        SourceLook("http://c", "Other ; 1"),
    ]
    verdict = wrong_network("j", TESTNET, looks, configured=True)
    assert verdict is not None and verdict.reason == "wrong-network"
    assert TESTNET in verdict.detail and "Other ; 1" in verdict.detail and "http://c" in verdict.detail
    assert wrong_network("j", TESTNET, looks[:2], configured=False) is None
    assert wrong_network("j", "", looks, configured=False) is None  # nothing pinned yet
    assert first_passphrase(looks[1:]) == "Other ; 1"


def test_another_hash_for_the_committed_ledger_is_a_reset_at_once() -> None:
    judge = ResetJudge(reset_after=60.0)
    same = [SourceLook("http://a", TESTNET, latest=120, hash_at="aa")]
    assert judge.judge(0.0, 100, "aa", same) is None
    other = [SourceLook("http://a", TESTNET, latest=120, hash_at="bb")]
    verdict = judge.judge(0.1, 100, "aa", other)
    assert verdict is not None and verdict.reason == "network-reset" and "bb" in verdict.detail


def test_every_url_below_the_committed_ledger_is_a_reset_only_after_the_bound() -> None:
    judge = ResetJudge(reset_after=2.0)
    below = [SourceLook("http://a", TESTNET, latest=3), SourceLook("http://b", None)]
    assert judge.judge(10.0, 100, "aa", below) is None
    assert judge.judge(11.9, 100, "aa", below) is None
    verdict = judge.judge(12.0, 100, "aa", below)
    assert verdict is not None and "below" in verdict.detail
    # a lagging URL that catches up within the bound starts the count again
    judge = ResetJudge(reset_after=2.0)
    assert judge.judge(0.0, 100, "aa", below) is None
    assert judge.judge(1.5, 100, "aa", [SourceLook("http://a", TESTNET, latest=100)]) is None
    assert judge.judge(3.0, 100, "aa", below) is None
    # one URL at or past the ledger is enough; none answering says nothing
    assert judge.judge(9.0, 100, "aa", [*below, SourceLook("http://c", TESTNET, latest=101)]) is None
    assert judge.judge(99.0, 100, "aa", [SourceLook("http://a", None)]) is None


def test_a_url_below_the_committed_ledger_whose_latest_closed_after_it_is_a_reset_at_once() -> None:
    judge = ResetJudge(reset_after=60.0)
    # ledger 100 committed, closed at t = 5000: a chain at ledger 3 closed at 5001 is another one
    reset = [SourceLook("http://a", TESTNET, latest=3, latest_closed_at=5001)]
    verdict = judge.judge(0.0, 100, "aa", reset, 5000)
    assert verdict is not None and verdict.reason == "network-reset"
    assert "http://a" in verdict.detail and "ledger 3 closed at 5001" in verdict.detail
    # a replica lagging behind a load balancer serves ledgers that closed before: only the bound
    lagging = [SourceLook("http://a", TESTNET, latest=97, latest_closed_at=4985)]
    judge = ResetJudge(reset_after=60.0)
    assert judge.judge(0.0, 100, "aa", lagging, 5000) is None
    assert judge.judge(59.9, 100, "aa", lagging, 5000) is None
    assert judge.judge(60.0, 100, "aa", lagging, 5000) is not None
    # no close time kept for the committed ledger, or none said: only the bound
    judge = ResetJudge(reset_after=60.0)
    assert judge.judge(0.0, 100, "aa", reset, None) is None
    assert judge.judge(1.0, 100, "aa", [SourceLook("http://a", TESTNET, latest=3)], 5000) is None


def test_a_job_takes_its_network_from_its_table_or_the_network_section() -> None:
    from ingestion.config import ConfigError, Settings

    settings = Settings.from_mapping({
        "network": {"passphrase": "futurenet"},
        "jobs": {"a": {"kind": "rpc", "network": "testnet"}, "b": {"kind": "horizon"}},
    })  # fmt: skip
    assert [j.network for j in settings.jobs] == [TESTNET, NETWORKS["futurenet"]]
    try:
        Settings.from_mapping({
            "network": {"check_ms": 0},
            "jobs": {"s": {"kind": "scheduled", "action": "ingestion.jobs:heartbeat", "period_ms": 1000,
                           "network": "testnet"}},
        })  # fmt: skip
    except ConfigError as exc:
        assert any("network.check_ms" in p for p in exc.problems)
        assert any("jobs.s" in p and "network" in p for p in exc.problems)
    else:
        raise AssertionError("a scheduled job's network and a zero check_ms were taken")
