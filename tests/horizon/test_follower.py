"""Unit tests of the I/O-free Horizon follower: no sockets, no trio, no clock."""

from __future__ import annotations

import email.utils
import itertools
import json

import pytest

from actors.source import Record, SourceFatalError
from ingestion.common.paging import toid, token_key
from ingestion.common.retry import RetryPolicy, parse_retry_after
from ingestion.horizon.failures import Failure, fatal_message, problem_detail
from ingestion.horizon.follower import HorizonFollower, Mode, PageRequest, StreamRequest, StreamSignal
from ingestion.horizon.pages import (
    Malformed,
    _split_indented_page,
    compact_json,
    compact_record_text,
    split_page,
    validate_page,
    validate_stream_record,
)
from ingestion.horizon.resources import check_resource
from ingestion.testing import recorded

AURORA = recorded.HORIZON / "aurora-rs_stellar-horizon-rs"  # outside the repository
URL_A = "http://a.example"
URL_B = "http://b.example"


def real_page(name: str) -> bytes:
    return recorded.require(AURORA / name).read_bytes()


def page(records: list[dict[str, object]]) -> bytes:
    return json.dumps({"_links": {}, "_embedded": {"records": records}}).encode()


def ops(*indexes: int) -> list[dict[str, object]]:
    return [{"id": str(toid(i, 1, 1)), "paging_token": str(toid(i, 1, 1))} for i in indexes]


def tok(i: int) -> str:
    return str(toid(i, 1, 1))


def body(i: int) -> str:
    return json.dumps({"paging_token": tok(i)}, separators=(",", ":"))


def follower(
    cursor: str = "0", urls: tuple[str, ...] = (URL_A,), **policy: float
) -> HorizonFollower:
    settings: dict[str, float] = {"base": 1.0, "cap": 8.0, "attempts_per_url": 3}
    settings.update(policy)
    return HorizonFollower(
        urls,
        "/operations",
        cursor,
        RetryPolicy(**settings),  # type: ignore[arg-type]
        page_limit=3,
        rng=lambda: 0.5,
    )


# --- backoff and Retry-After ---------------------------------------------------------------------


@pytest.mark.parametrize("u", [0.0, 0.5, 0.999999])
def test_backoff_is_exponential_jittered_and_never_above_cap(u: float) -> None:
    policy = RetryPolicy(base=0.25, cap=10.0)
    for attempt in range(1, 80):
        ceiling = min(10.0, 0.25 * 2 ** (attempt - 1))
        delay = policy.delay(attempt, u)
        assert ceiling / 2 <= delay <= ceiling <= 10.0
    assert policy.delay(1, 0.0) == 0.125
    assert policy.delay(3, 0.999999) == pytest.approx(1.0)


def test_retry_policy_rejects_nonsense() -> None:
    with pytest.raises(ValueError, match="base"):
        RetryPolicy(base=0)
    with pytest.raises(ValueError, match="cap"):
        RetryPolicy(base=5, cap=1)
    with pytest.raises(ValueError, match="attempts"):
        RetryPolicy(attempts_per_url=0)


def test_retry_after_parses_seconds_and_http_dates() -> None:
    now = 1_700_000_000.0
    assert parse_retry_after("5", now) == 5.0
    assert parse_retry_after(" 12 ", now) == 12.0
    assert parse_retry_after(email.utils.formatdate(now + 30, usegmt=True), now) == 30.0
    assert parse_retry_after(email.utils.formatdate(now - 30, usegmt=True), now) == 0.0
    for bad in (None, "", "-1", "soon", "1.5"):
        assert parse_retry_after(bad, now) is None


# --- validation ----------------------------------------------------------------------------------


def test_real_horizon_page_validates_and_bodies_are_compact_json_of_each_record() -> None:
    content = real_page("pubnet_operations_asc_200__all_operations@2f77f0c.json")
    outcome = validate_page(content, "0")
    originals = json.loads(content)["_embedded"]["records"]
    assert outcome.malformed is None and outcome.full and len(outcome.records) == 200
    tokens = [r.paging_token for r in outcome.records]
    assert tokens == [o["paging_token"] for o in originals]
    assert all(token_key(a) < token_key(b) for a, b in itertools.pairwise(tokens))
    for record, original in zip(outcome.records, originals, strict=True):
        assert json.loads(record.body) == original
        assert "\n" not in record.body and ", " not in record.body[:40]
    # Horizon's own escaping survives the round trip: its hrefs carry \u0026, never a bare &.
    assert "\\u0026" in outcome.records[0].body and "&" not in outcome.records[0].body


def test_real_effects_page_validates_with_effect_tokens() -> None:
    outcome = validate_page(real_page("pubnet_effects_asc_200__all_effects@2f77f0c.json"), None)
    assert outcome.malformed is None and len(outcome.records) == 200
    assert outcome.records[0].paging_token == "12884905985-1"


def test_desc_page_is_rejected_at_its_second_record() -> None:
    outcome = validate_page(real_page("testnet_effects_desc_200__all_effects@HEAD.json"), None)
    assert len(outcome.records) == 1
    assert outcome.malformed is not None and outcome.malformed.reason == "paging-token-out-of-order"


def test_page_with_records_not_after_the_cursor_is_malformed() -> None:
    outcome = validate_page(page(ops(1, 2)), tok(2))
    assert outcome.records == ()
    assert outcome.malformed == Malformed("paging-token-out-of-order", tok(1))


@pytest.mark.parametrize(
    ("bad", "reason"),
    [
        ({"id": "x"}, "missing-paging-token"),
        ({"paging_token": 12}, "missing-paging-token"),
        ({"paging_token": "abc"}, "invalid-paging-token"),
        ({"paging_token": tok(1)}, "paging-token-out-of-order"),
        ({"paging_token": tok(2)}, "duplicate-paging-token"),
        ("just a string", "not-an-object"),
    ],
)
def test_page_keeps_records_before_the_first_bad_one_and_nothing_after(
    bad: object, reason: str
) -> None:
    records = [*ops(1, 2), bad, *ops(4)]
    outcome = validate_page(page(records), None)  # type: ignore[arg-type]
    assert [r.paging_token for r in outcome.records] == [tok(1), tok(2)]
    assert outcome.malformed is not None and outcome.malformed.reason == reason
    assert not outcome.full


def test_page_bodies_are_the_record_text_as_sent_compacted() -> None:
    recs: list[dict[str, object]] = [
        {"paging_token": tok(1), "memo": "caf\u00e9 & <b>", "n": [1, 2.50], "e": {}, "a": []},
        {"paging_token": tok(2), "nested": {"x": [{"y": "  spaced: out  "}], "z": None}},
    ]
    compact = json.dumps({"_embedded": {"records": recs}}, separators=(",", ":"))  # \u00e9 kept
    spaced = json.dumps({"_links": {"a": "}"}, "_embedded": {"x": [1], "records": recs}})
    pretty = json.dumps({"_embedded": {"records": recs}}, indent=2, ensure_ascii=False)
    as_sent = [
        [json.dumps(r, separators=(",", ":")) for r in recs],
        [json.dumps(r) for r in recs],
        [json.dumps(r, separators=(",", ":"), ensure_ascii=False) for r in recs],
    ]
    for content, bodies in zip((compact, spaced, pretty), as_sent, strict=True):
        outcome = validate_page(content.encode(), None)
        assert outcome.malformed is None
        assert [r.body for r in outcome.records] == bodies


def test_indented_page_compacts_to_exactly_what_horizon_streams() -> None:
    # Go's MarshalIndent vs Marshal, as the simulator renders them: escapes are the server's.
    content = real_page("pubnet_transactions_asc_200__all_transactions.json")
    for record in validate_page(content, None).records:
        assert record.body == compact_json(json.loads(record.body))


def test_a_quote_colon_inside_a_string_is_compacted_exactly() -> None:
    rec = {"paging_token": tok(1), "memo": 'he said ": hi', "k\\": "v"}
    pretty = json.dumps({"_embedded": {"records": [rec]}}, indent=2, ensure_ascii=False)
    (record,) = validate_page(pretty, None).records
    assert record.body == compact_json(rec) and json.loads(record.body) == rec


def _general(text: str) -> list[Record]:
    return [Record(r["paging_token"], compact_record_text(r, t)) for r, t in split_page(text)]


def _fast(text: str) -> list[Record] | None:
    out = _split_indented_page(text.encode(), None, 200)
    return None if out is None else list(out.records)


def test_the_fast_split_of_indented_pages_agrees_with_the_general_one() -> None:
    """Indented pages whose records are all good take a fast path (a parser's compaction and
    cut, nothing decoded but the tokens); it must give exactly the general path's records and
    bodies, and step aside (None) for anything else."""
    for name in (
        "pubnet_operations_asc_200__all_operations@2f77f0c.json",
        "pubnet_effects_asc_200__all_effects@2f77f0c.json",
        "pubnet_transactions_asc_200__all_transactions.json",
    ):
        text = real_page(name).decode()
        assert _fast(text) == _general(text), name  # real Horizon pages take the fast path
    recs = ops(1, 2, 3)
    go_layout = json.dumps({"_links": {}, "_embedded": {"records": recs}}, indent=2)
    assert _fast(go_layout) == [Record(r["paging_token"], compact_json(r)) for r in recs]
    # a page on one line is kept as sent: the general path
    assert _fast(page(recs).decode()) is None
    tricky = [{**recs[0], "x": [{"a": 1}, {"b": 2}]}, recs[1]]
    text = json.dumps({"_links": {}, "_embedded": {"records": tricky}}, indent=2)
    assert _fast(text) == [Record(r["paging_token"], compact_json(r)) for r in tricky]
    # whatever a server puts around the records, the parser cuts exactly them
    extra = {"_links": {}, "_embedded": {"records": recs, "other": [{"k": "v"}]}}
    text = json.dumps(extra, indent=2)
    assert _fast(text) == [Record(r["paging_token"], compact_json(r)) for r in recs]
    assert [r.body for r in validate_page(text, None).records] == [compact_json(r) for r in recs]
    decoy = {"_embedded": {"records": [{"paging_token": "1", "evil": 1}]}}
    compact_page = json.dumps(
        {"_links": {"x": "DECOY"}, "_embedded": {"records": [{"paging_token": "1"}]}},
        separators=(",", ":"),
    ).replace('"DECOY"', json.dumps(decoy, indent=2))
    assert _fast(compact_page) == [Record("1", '{"paging_token":"1"}')]
    assert [r.body for r in validate_page(compact_page, None).records] == ['{"paging_token":"1"}']
    # a quote-colon inside a string is kept as written (no re-serializing)
    quoted = [{**recs[0], "memo": 'he said \\": hi'}]
    text = json.dumps({"_embedded": {"records": quoted}}, indent=2)
    assert _fast(text) == [Record(r["paging_token"], json.dumps(r, separators=(",", ":"))) for r in quoted]
    # anything wrong in a record: the general path says which, keeping those before it
    for bad in ({"id": "x"}, {"paging_token": 12}, {"paging_token": "abc"}, "s", {"paging_token": tok(1)}):
        text = json.dumps({"_embedded": {"records": [*ops(1, 2), bad]}}, indent=2)
        assert _fast(text) is None
    assert _split_indented_page(go_layout.encode(), tok(1), 200) is None  # not after the cursor
    outcome = _split_indented_page(go_layout.encode(), "0", 3)
    assert outcome is not None and outcome.full and outcome.malformed is None


def test_every_truncation_of_a_page_is_broken_json() -> None:
    content = page(ops(1, 2, 3)).decode()
    for end in range(len(content)):
        outcome = validate_page(content[:end], None)
        assert outcome.records == () and outcome.malformed is not None, end
    for junk in (content + "x", content.replace(",", ",,", 1), content.replace(":", "", 1)):
        assert validate_page(junk, None).malformed is not None


def test_broken_or_non_page_json_yields_nothing() -> None:
    broken = validate_page(b'{"_embedded": {"records": [{"paging_token": "1', None)
    assert broken.records == () and broken.malformed is not None
    assert broken.malformed.reason == "broken-json"
    assert '{"_embedded"' in broken.malformed.value
    for content in (b"[]", b'{"_embedded": {}}', b'{"_embedded": {"records": 3}}'):
        outcome = validate_page(content, None)
        assert outcome.malformed is not None and outcome.malformed.reason == "not-a-page"


def test_stream_record_body_is_the_data_text_untouched() -> None:
    data = f'{{"id":"{tok(5)}","paging_token":"{tok(5)}","memo":"caf\u00e9 & <b>"}}'
    assert validate_stream_record(tok(5), data, tok(4)) == Record(tok(5), data)
    assert validate_stream_record("", data, None) == Record(tok(5), data)


@pytest.mark.parametrize(
    ("event_id", "data", "after", "reason"),
    [
        (tok(5), body(5)[:-1], None, "broken-json"),
        (tok(5), '{"id":"1"}', None, "missing-paging-token"),
        (tok(6), body(5), None, "id-mismatch"),
        (tok(5), body(5), tok(5), "duplicate-paging-token"),
        (tok(5), body(5), tok(9), "paging-token-out-of-order"),
        (tok(5), '"hello"', None, "not-an-object"),
    ],
)
def test_bad_stream_records_are_detected(
    event_id: str, data: str, after: str | None, reason: str
) -> None:
    result = validate_stream_record(event_id, data, after)
    assert isinstance(result, Malformed) and result.reason == reason


def test_compact_json_is_go_json_marshal() -> None:
    rec = {"a": [1, 2], "memo": "caf\u00e9 <b>&</b> \u2028\u2029", "n": None}
    assert compact_json(rec) == (
        '{"a":[1,2],"memo":"caf\u00e9 \\u003cb\\u003e\\u0026\\u003c/b\\u003e '
        '\\u2028\\u2029","n":null}'
    )
    plain = {"x": "caf\u00e9"}
    assert compact_json(plain) == json.dumps(plain, separators=(",", ":"), ensure_ascii=False)


# --- next-request logic --------------------------------------------------------------------------


def test_starts_paging_from_the_cursor_and_pages_while_pages_are_full() -> None:
    f = follower("0")
    first = f.next_attempt()
    assert first.delay == 0
    assert first.request == PageRequest(URL_A, URL_A + "/operations", "0", 3)
    assert first.request.params == {"order": "asc", "limit": "3", "cursor": "0"}
    outcome = f.on_page(page(ops(1, 2, 3)))
    assert outcome.full and f.mode is Mode.CATCH_UP
    assert f.next_attempt().request == PageRequest(URL_A, URL_A + "/operations", tok(3), 3)


def test_a_short_page_switches_to_streaming_from_the_last_token() -> None:
    f = follower(tok(3))
    f.next_attempt()
    f.on_page(page(ops(4, 5)))
    request = f.next_attempt().request
    assert request == StreamRequest(URL_A, URL_A + "/operations", tok(5))
    assert isinstance(request, StreamRequest)
    assert request.headers == {"Last-Event-ID": tok(5)}
    assert request.params["cursor"] == tok(5)


def test_an_empty_first_page_streams_from_the_start_cursor() -> None:
    f = follower(tok(3))
    f.next_attempt()
    assert f.on_page(page([])).records == ()
    assert f.next_attempt().request == StreamRequest(URL_A, URL_A + "/operations", tok(3))


def test_cursor_now_goes_straight_to_streaming_without_last_event_id() -> None:
    f = follower("now")
    request = f.next_attempt().request
    assert isinstance(request, StreamRequest)
    assert request.cursor == "now" and request.headers == {}
    assert f.last_token is None
    assert isinstance(f.on_stream_event("message", tok(7), body(7)), Record)
    assert f.last_token == tok(7)


def test_bad_start_cursor_is_fatal_and_says_so() -> None:
    with pytest.raises(SourceFatalError, match="'latest' is neither 'now' nor a Horizon paging"):
        follower("latest")


def test_stream_reconnects_at_once_after_records_and_backs_off_when_quiet() -> None:
    f = follower("now")
    f.next_attempt()
    f.on_stream_open()
    assert f.on_stream_event("open", "", '"hello"') is StreamSignal.IGNORE
    f.on_stream_event("message", tok(1), body(1))
    assert f.on_stream_event("close", tok(1), '"byebye"') is StreamSignal.CLOSED
    assert f.on_stream_end(got_records=True) == 0
    attempt = f.next_attempt()
    assert attempt.delay == 0 and attempt.request == StreamRequest(
        URL_A, URL_A + "/operations", tok(1)
    )
    delays = [f.on_stream_end(got_records=False) for _ in range(4)]
    assert delays == [0.75, 1.5, 3.0, 6.0]  # base 1, u=0.5: 0.75 * 2**n, capped at 8
    assert f.next_attempt().delay == 6.0
    assert f.mode is Mode.STREAMING


def test_a_quiet_stream_closed_at_horizons_timeout_is_reopened_at_once() -> None:
    f = follower("now")
    f.next_attempt()
    quick = f.policy.stream_quick_close
    # Sparse collection: streams stay open until Horizon's 55 s timeout, then close empty.
    assert [f.on_stream_end(got_records=False, open_for=55.0) for _ in range(5)] == [0.0] * 5
    assert f.next_attempt().delay == 0
    # Closing soon after opening, with nothing: back off, and grow.
    delays = [f.on_stream_end(got_records=False, open_for=quick / 10) for _ in range(3)]
    assert delays == [0.75, 1.5, 3.0]
    # One normal quiet close resets the run.
    assert f.on_stream_end(got_records=False, open_for=quick) == 0.0
    assert f.on_stream_end(got_records=False, open_for=0.0) == 0.75


def test_a_failed_stream_falls_back_to_paging_from_the_last_token() -> None:
    f = follower(tok(1))
    f.next_attempt()
    f.on_page(page(ops(2)))
    f.next_attempt()
    f.on_stream_open()
    f.on_stream_event("message", tok(3), body(3))
    retry = f.on_failure(Failure(None, "ReadError"), url="u")
    assert retry.attempt == 1 and retry.delay == 0.75
    attempt = f.next_attempt()
    assert attempt.request == PageRequest(URL_A, URL_A + "/operations", tok(3), 3)
    assert attempt.delay == 0.75


def test_retryable_failures_back_off_then_fail_over_and_resume_from_the_same_cursor() -> None:
    f = follower(tok(1), urls=(URL_A, URL_B))
    f.next_attempt()
    retries = [f.on_failure(Failure(503, "Service Unavailable"), url="u") for _ in range(2)]
    assert [r.delay for r in retries] == [0.75, 1.5]
    assert all(r.failover_to is None for r in retries)
    third = f.on_failure(Failure(None, "ConnectError"), url="u")
    assert (third.failover_from, third.failover_to, third.delay) == (URL_A, URL_B, 0.0)
    attempt = f.next_attempt()
    assert attempt.request == PageRequest(URL_B, URL_B + "/operations", tok(1), 3)
    # After a whole lap over every URL, switching back waits like any retry.
    for _ in range(2):
        f.on_failure(Failure(500, "x"), url="u")
    lap = f.on_failure(Failure(500, "x"), url="u")
    assert lap.failover_to == URL_A and lap.delay == 8.0 * 0.75


def test_success_resets_the_failure_count_and_sticks_to_the_working_url() -> None:
    f = follower("0", urls=(URL_A, URL_B), attempts_per_url=2)
    for _ in range(2):
        f.on_failure(Failure(502, "x"), url="u")
    assert f.base_url == URL_B
    f.on_page(page(ops(1, 2, 3)))
    assert f.consecutive_failures == 0 and f.base_url == URL_B
    assert f.on_failure(Failure(502, "x"), url="u").delay == 0.75


def test_429_honours_retry_after_within_its_cap() -> None:
    f = follower("0", retry_after_cap=20.0)
    assert f.on_failure(Failure(429, "rate", retry_after=5.0), url="u").delay == 5.0
    assert f.next_attempt().delay == 5.0
    assert f.on_failure(Failure(429, "rate", retry_after=3600.0), url="u").delay == 20.0
    # Retry-After: 0 does not make a tight loop.
    assert f.on_failure(Failure(429, "rate", retry_after=0.0), url="u").delay > 0


@pytest.mark.parametrize(("status", "fix"), [(400, "cursor"), (404, "--resource"), (403, "access")])
def test_unfixable_4xx_is_fatal_with_url_and_horizon_detail(status: int, fix: str) -> None:
    f = follower("0")
    url = "http://a.example/accounts/GXX/payments?cursor=0"
    detail = "The resource at the url requested was not found."
    with pytest.raises(SourceFatalError) as info:
        f.on_failure(Failure(status, detail), url=url)
    message = str(info.value)
    assert url in message and detail in message and fix in message and str(status) in message


def test_problem_detail_keeps_horizon_detail_and_extras() -> None:
    body = json.dumps(
        {
            "type": "https://stellar.org/horizon-errors/bad_request",
            "title": "Bad Request",
            "status": 400,
            "detail": "The request you sent was invalid in some way.",
            "extras": {"invalid_field": "cursor", "reason": "cursor: invalid value"},
        }
    ).encode()
    text = problem_detail(body)
    assert "invalid in some way" in text and "invalid_field=cursor" in text
    assert "cursor: invalid value" in text
    assert problem_detail(b"<html>oops</html>") == "<html>oops</html>"
    assert "HTTP 400" in fatal_message(400, "http://x/operations", text)


def test_malformed_data_refetches_from_the_last_good_token_then_gives_up() -> None:
    f = follower(tok(1), malformed_retries=2)
    f.next_attempt()
    outcome = f.on_page(page([*ops(2), {"id": "no token"}]))
    assert [r.paging_token for r in outcome.records] == [tok(2)]
    assert f.last_retry is not None and f.last_retry.delay == 0.75
    attempt = f.next_attempt()
    assert attempt.request == PageRequest(URL_A, URL_A + "/operations", tok(2), 3)
    assert attempt.delay == 0.75
    f.on_page(page([{"id": "no token"}]))
    with pytest.raises(SourceFatalError, match="malformed data after paging token"):
        f.on_page(page([{"id": "no token"}]))


def test_progress_between_malformed_responses_resets_the_strikes() -> None:
    f = follower(tok(1), malformed_retries=1)
    for i in range(2, 8):
        f.on_page(page([*ops(i), {"id": "bad"}]))
    assert f.cursor == tok(7) and f.malformed_strikes == 1


def test_malformed_stream_event_falls_back_to_paging_and_keeps_the_cursor() -> None:
    f = follower("now")
    f.next_attempt()
    f.on_stream_event("message", tok(4), body(4))
    result = f.on_stream_event("message", tok(4), body(4))
    assert isinstance(result, Malformed) and result.reason == "duplicate-paging-token"
    assert f.cursor == tok(4)
    assert f.next_attempt().request == PageRequest(URL_A, URL_A + "/operations", tok(4), 3)


def test_resource_paths_are_checked() -> None:
    for ok in (
        "/operations",
        "/ledgers",
        "/effects",
        "/accounts/GALPCCZN4YXA3YMJHKL6CVIECKPLJJCTVMSNYWBTKJW4K5HQLYLDMZTB/payments",
        "/ledgers/123/transactions",
        "/trades",
        "/accounts/GALPCCZN4YXA3YMJHKL6CVIECKPLJJCTVMSNYWBTKJW4K5HQLYLDMZTB/trades",
        "/liquidity_pools/" + "ab" * 32 + "/effects",
        "/claimable_balances/" + "00" * 36 + "/operations",
        "/offers/12345/trades",
    ):
        assert check_resource(ok) == ok
    for bad in ("operations", "/operations/", "/offers", "/accounts/G/x/payments", "/"):
        with pytest.raises(ValueError, match="not a Horizon collection path"):
            check_resource(bad)


def test_a_504_retries_the_page_with_half_the_limit_then_grows_back() -> None:
    f = HorizonFollower(["http://h"], "/operations", "0", RetryPolicy(), rng=lambda: 0.5)
    limits = []
    for _ in range(3):  # Horizon's query timeout, three times in a row
        limits.append(f.next_attempt().request.limit)  # type: ignore[union-attr]
        f.on_failure(Failure(504, "Timeout"), url="http://h/operations")
    attempt = f.next_attempt()
    assert isinstance(attempt.request, PageRequest) and attempt.request.cursor == "0"
    limits.append(attempt.request.limit)
    assert limits == [200, 100, 50, 25]
    f.on_page(page(ops(*range(1, 26))))  # full at 25: more to come, and twice as much next time
    assert f.mode is Mode.CATCH_UP
    grown = []
    for first in (26, 76, 176):
        request = f.next_attempt().request
        assert isinstance(request, PageRequest)
        grown.append(request.limit)
        f.on_page(page(ops(*range(first, first + request.limit))))
    assert grown == [50, 100, 200]
    # Other failures do not shrink it.
    f.on_failure(Failure(503, "Service Unavailable"), url="http://h/operations")
    assert f.next_attempt().request.limit == 200  # type: ignore[union-attr]


def test_an_account_404_is_retried_and_fatal_only_once_every_url_agreed_for_the_give_up_time() -> None:
    urls = ("http://a", "http://b")
    resource = "/accounts/GABC/payments"
    policy = RetryPolicy(base=1.0, cap=8.0, attempts_per_url=1, not_found_give_up=30.0)
    f = HorizonFollower(urls, resource, "0", policy, rng=lambda: 0.5)
    missing = Failure(404, "Resource Missing")
    f.on_failure(missing, url="http://a" + resource, now=0.0)  # a: 404; fail over to b
    assert f.base_url == "http://b"
    f.on_failure(missing, url="http://b" + resource, now=1.0)  # both agree now, not for long
    f.on_failure(missing, url="http://a" + resource, now=29.0)
    f.on_page(page([]))  # b (a lagging mirror caught up): the account exists, start over
    f.on_failure(missing, url="http://a" + resource, now=100.0)
    f.on_failure(missing, url="http://b" + resource, now=120.0)
    with pytest.raises(SourceFatalError, match="every URL answered 404 for 30 s"):
        f.on_failure(missing, url="http://a" + resource, now=130.0)
    # Not account-scoped: a 404 is a wrong path, fatal at once.
    g = HorizonFollower(urls, "/transactions/" + "ab" * 32 + "/operations", "0", policy)
    with pytest.raises(SourceFatalError):
        g.on_failure(missing, url="http://a/x", now=0.0)


def test_a_resource_may_carry_the_parameters_that_change_what_it_returns() -> None:
    assert check_resource("/operations?include_failed=true&join=transactions")
    assert check_resource("/accounts/GA/payments?join=transactions")
    assert check_resource("/transactions?include_failed=false")
    for bad in ("/ledgers?join=transactions", "/effects?include_failed=true", "/operations?join=ledgers",
                "/operations?order=desc", "/operations?cursor=5"):
        with pytest.raises(ValueError, match="not a parameter"):
            check_resource(bad)
    f = HorizonFollower(["http://h"], "/payments?join=transactions", "0", RetryPolicy())
    request = f.next_attempt().request
    assert request.url == "http://h/payments"
    assert request.params == {"join": "transactions", "order": "asc", "limit": "200", "cursor": "0"}
    f.on_page(page([]))
    stream = f.next_attempt().request
    assert isinstance(stream, StreamRequest) and stream.params["join"] == "transactions"
