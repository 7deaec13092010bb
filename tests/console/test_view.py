"""The console's pure core: the nodes' presence reports in, the cluster's picture out (no I/O;
times are given)."""

from __future__ import annotations

from typing import Any

from ingestion.serve.console import ClusterView, why_leaderless


def report(jobs: dict[str, dict[str, Any]], every_ms: int = 1000) -> dict[str, Any]:
    return {"version": "1.2.3", "every_ms": every_ms, "jobs": jobs}


def leader(token: int, left_ms: int = 1500, **more: Any) -> dict[str, Any]:
    return {"kind": "horizon", "role": "leader", "token": token, "leader": "x", "lease_ms_left": left_ms,
            "since_ms": 1000, "cursor": f"c{token}", "rate": 10.0, "lag_seconds": 0.5, "source_up": True,
            "held_off": None, **more}  # fmt: skip


def standby(**more: Any) -> dict[str, Any]:
    return {"kind": "horizon", "role": "standby", "token": 1, "leader": "a", "lease_ms_left": None,
            "source_up": True, "held_off": None, **more}  # fmt: skip


def jobs_of(view: ClusterView, now: float) -> dict[str, dict[str, Any]]:
    return {j["job"]: j for j in view.state(now)["jobs"]}


def test_a_leaders_claim_lasts_as_long_as_the_lease_it_reported() -> None:
    view = ClusterView("c")
    view.heard("a", 1000, report({"h": leader(3, left_ms=1500)}), seen_at=10.0)
    view.heard("b", 1000, report({"h": standby()}), seen_at=10.0)
    assert jobs_of(view, 10.5)["h"]["leader"] == "a"
    assert jobs_of(view, 10.5)["h"]["lease_ttl_ms_left"] == 1000
    # a said nothing more (SIGKILLed): once its lease (and the slack) has run out, nobody leads
    gone = jobs_of(view, 11.8)["h"]
    assert gone["leader"] == "" and gone["token"] is None
    assert gone["why"] == "a: about to campaign (leader); b: about to campaign (standby)"


def test_of_two_claims_the_higher_token_wins_and_an_older_report_changes_nothing() -> None:
    view = ClusterView("c")
    view.heard("a", 1000, report({"h": leader(3)}), seen_at=10.0)
    view.heard("b", 1100, report({"h": leader(4)}), seen_at=10.1)  # a paused former leader's report lingers
    assert jobs_of(view, 10.2)["h"]["leader"] == "b"
    assert jobs_of(view, 10.2)["h"]["cursor"] == "c4"
    view.heard("b", 900, report({"h": standby()}), seen_at=10.2)  # older than the one held: ignored
    assert jobs_of(view, 10.3)["h"]["leader"] == "b"


def test_nodes_are_live_by_their_report_period_and_one_that_left_is_gone() -> None:
    view = ClusterView("c")
    view.heard("a", 1000, report({"h": leader(1, left_ms=5000), "w": standby(kind="webhook")}, every_ms=1000),
               seen_at=10.0)  # fmt: skip
    held = standby(source_up=False, held_off="source-unreachable")
    view.heard("b", 1000, report({"h": held}), seen_at=10.0)
    nodes = {n["node"]: n for n in view.state(12.4)["nodes"]}
    assert nodes["a"]["live"] and nodes["a"]["share"] == "1 of 2" and nodes["a"]["leads"] == ["h"]
    assert nodes["b"]["health"] == {"h": "down"} and nodes["b"]["held_off"] == {"h": "source-unreachable"}
    assert nodes["a"]["heartbeat_ms_ago"] == 2400 and nodes["a"]["version"] == "1.2.3"
    assert not {n["node"]: n for n in view.state(12.6)["nodes"]}["a"]["live"]  # 2.5 periods
    view.heard("b", 1200, None, seen_at=10.5)  # left gracefully
    assert "b" not in {n["node"] for n in view.state(10.6)["nodes"]}
    assert [h["node"] for h in jobs_of(view, 10.6)["h"]["hosts"]] == ["a"]


def test_a_job_no_live_node_reports_comes_from_redis_and_says_why_it_has_no_leader() -> None:
    view = ClusterView("c")
    view.unreported = {"old": {"leader": "", "token": 9, "cursor": "77", "lease_ttl_ms_left": None}}
    view.heard("a", 1000, report({"h": leader(1)}), seen_at=0.0)
    jobs = jobs_of(view, 100.0)
    assert jobs["old"]["cursor"] == "77" and jobs["old"]["why"] == "no live node hosts it"
    assert jobs["h"]["why"] == "no live node hosts it (hosted by a, all down)"


def test_why_names_each_hosts_reason() -> None:
    hosts = [
        {"node": "a", "live": True, "role": "standby", "source_up": True, "held_off": "sink-unreachable (x)"},
        {"node": "b", "live": True, "role": "standby", "source_up": False, "held_off": ""},
        {"node": "c", "live": True, "role": "starting", "source_up": None, "held_off": ""},
        {"node": "d", "live": False, "role": "standby", "source_up": True, "held_off": ""},
    ]
    assert why_leaderless(hosts) == (
        "a: held off: sink-unreachable (x); b: its source is unreachable; c: starting"
    )


def test_a_backfill_is_shown_on_its_jobs_page_with_each_range_and_every_value_escaped() -> None:
    from ingestion.serve.backfill_section import backfill_section

    doc = {
        "first_ledger": 10, "last_ledger": 19, "ranges": 2, "state": "done", "created_at": "2026-01-01",
        "created_by": "<b>eve</b>@host", "ledgers": 10, "ledgers_done": 10, "records": 7,
        "complete_through": 19,
        "range_states": [
            {"range": "j~10-14", "first_ledger": 10, "last_ledger": 14, "ledgers": 5, "ledgers_done": 5,
             "records": 3, "state": "done", "leader": None},
            {"range": "j~15-19", "first_ledger": 15, "last_ledger": 19, "ledgers": 5, "ledgers_done": 5,
             "records": 4, "state": "done", "leader": None},
        ],
    }  # fmt: skip
    html = backfill_section(doc)
    assert '<span id="backfill-state">done</span>' in html and "complete through ledger 19" in html
    assert "&lt;b&gt;eve&lt;/b&gt;@host" in html and "<b>" not in html
    assert html.count("<tr>") == 3 and '<td data-col="ledgers_done">5/5</td>' in html
    assert backfill_section(None) == ""
    assert "no ledger complete yet" in backfill_section({**doc, "complete_through": 9})
