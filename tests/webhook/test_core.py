"""The webhook rules alone: signatures the official package accepts, ids, answers, the schedule,
the delivered window; and the webhook job's settings."""

from __future__ import annotations

import datetime
import json
from pathlib import Path

import pytest
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from ingestion.config import ConfigError
from ingestion.config.layers import load
from ingestion.webhook.core import (
    DEFAULT_SCHEDULE,
    RetrySchedule,
    Window,
    envelope,
    event_type,
    judge,
    message_id,
    parse_duration,
    parse_secrets,
    post_body,
    sign,
)

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
OTHER = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD"


def test_signatures_verify_with_the_official_package_also_during_a_rotation() -> None:
    record = '{"id":"1","amount":"5"}'
    body = envelope("stellar.horizon.payment", "2026-12-04T00:00:00Z", "ops:1", 7, record).encode()
    ts = int(datetime.datetime.now(datetime.UTC).timestamp())
    headers = {"webhook-id": "ops:1", "webhook-timestamp": str(ts)}
    one = sign(parse_secrets(SECRET), "ops:1", ts, body)
    assert Webhook(SECRET).verify(body, headers | {"webhook-signature": one})["data"]["amount"] == "5"
    both = sign(parse_secrets(f"{OTHER} {SECRET}"), "ops:1", ts, body)
    assert len(both.split()) == 2
    for secret in (SECRET, OTHER):  # a receiver on either side of the rotation accepts it
        Webhook(secret).verify(body, headers | {"webhook-signature": both})
    with pytest.raises(WebhookVerificationError):
        Webhook(SECRET).verify(body + b" ", headers | {"webhook-signature": one})


def test_the_envelope_keeps_the_record_bytes_as_committed() -> None:
    record = '{"id":"12","paging_token":"12","type":"payment","amount":"1.0000000"}'
    text = envelope(event_type("horizon", json.loads(record)), "t", "ops:12", 7, record)
    assert text.endswith(f'"data":{record}}}')
    payload = json.loads(text)
    assert payload["type"] == "stellar.horizon.payment"
    # the record's own id and the term's fence are in the body: the signature covers them
    assert (payload["id"], payload["fencing_token"]) == ("ops:12", 7)
    two = [("t", "x", "ops:12", record), ("t", "x", "ops:13", "{}")]
    batch = json.loads(post_body(two, 9, as_batch=True))  # a batch: each payload under the POST's token
    assert [(p["id"], p["fencing_token"]) for p in batch] == [("ops:12", 9), ("ops:13", 9)]
    assert event_type("rpc", {"type": "contract"}) == "stellar.contract.event"
    assert event_type("lake", {"type": "system"}) == "stellar.system.event"


def test_ids_are_derived_from_the_source_job_and_the_record() -> None:
    assert message_id("ops", "12") == "ops:12"
    assert message_id("ops", "12", "12") == "ops:12"
    assert message_id("ops", "12", "40") == "ops:12:40"


@pytest.mark.parametrize(
    ("status", "verdict"),
    [(200, "delivered"), (204, "delivered"), (299, "delivered"), (301, "failed"), (302, "failed"),
     (400, "failed"), (410, "gone"), (429, "failed"), (500, "failed"), (503, "failed"), (None, "failed")],
)  # fmt: skip
def test_only_2xx_is_success_and_410_disables(status: int | None, verdict: str) -> None:
    assert judge(status) == verdict


def test_the_default_schedule_spans_more_than_a_day_and_honours_retry_after() -> None:
    schedule = RetrySchedule.parse(DEFAULT_SCHEDULE)
    assert schedule.span >= 24 * 3600
    assert len(schedule.delays) + 1 == 8  # attempts in all
    assert schedule.delay(1, 0.5) == pytest.approx(5.0)
    assert 4.0 <= schedule.delay(1, 0.0) <= schedule.delay(1, 0.999) <= 6.0  # type: ignore[operator]
    assert schedule.delay(1, 0.5, retry_after=120) == 120  # never earlier than the receiver asks
    assert schedule.delay(1, 0.5, retry_after=1) == pytest.approx(5.0)
    assert schedule.delay(8, 0.5) is None and schedule.exhausted(8, 0)
    assert not schedule.exhausted(7, 10**6)
    aged = RetrySchedule.parse(DEFAULT_SCHEDULE, max_age=3600)
    assert aged.exhausted(2, 3600) and not aged.exhausted(2, 3599)


@pytest.mark.parametrize("text", ["", "5", "5 sec", "-1s", "1w"])
def test_bad_durations_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="duration"):
        parse_duration(text)


@pytest.mark.parametrize(
    ("secret", "problem"),
    [("", "no secret"), ("abc", "does not start"), ("whsec_!!!", "not base64"), ("whsec_YWJj", "too short"),
     (f"{SECRET} {SECRET} {SECRET}", "at most two")],
)  # fmt: skip
def test_bad_secrets_are_refused_without_showing_them(secret: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem) as caught:
        parse_secrets(secret)
    assert "MfKQ9r8" not in str(caught.value) and "YWJj" not in str(caught.value)


def test_the_window_commits_only_a_finished_prefix() -> None:
    w = Window()
    for key in ("1", "2", "3"):
        w.opened(key)
    w.finished("2", "delivered")
    assert w.take_done() == []
    w.finished("1", "dead")
    assert w.take_done() == [("1", "dead"), ("2", "delivered")]
    w.finished("3", "delivered")
    assert w.take_done() == [("3", "delivered")] and len(w) == 0


def _config(tmp_path: Path, table: str) -> Path:
    path = tmp_path / "config.toml"
    path.write_text('[jobs.ops]\nkind = "horizon"\nresource = "/payments"\n' + table)
    return path


def test_a_webhook_job_from_config_with_its_secret_from_the_environment(tmp_path: Path) -> None:
    path = _config(tmp_path, '[jobs.hook]\nkind = "webhook"\nfrom = "ops"\nurl = "https://example.test/in"\n'
                             'start = "first"\nbatch = 50\nretry_schedule = ["1s", "1m"]\n')  # fmt: skip
    settings = load(path, {"INGESTION_JOBS_HOOK_SECRET": SECRET}, {})
    hook = settings.jobs[1]
    assert hook.kind == "webhook" and hook.start_cursor == "0" and hook.webhook is not None
    assert hook.webhook.source_job == "ops" and hook.webhook.source_kind == "horizon"
    assert hook.webhook.batch == 50 and hook.webhook.retry_schedule == ("1s", "1m")
    assert SECRET not in repr(hook)


def test_a_secret_file(tmp_path: Path) -> None:
    (tmp_path / "secret").write_text(SECRET + "\n")
    path = _config(tmp_path, f'[jobs.hook]\nkind = "webhook"\nfrom = "ops"\nurl = "http://127.0.0.1:1/"\n'
                             f'secret_file = "{tmp_path / "secret"}"\n')  # fmt: skip
    hook = load(path, {}, {}).jobs[1].webhook
    assert hook is not None and hook.secret == SECRET


def test_webhook_settings_problems_are_one_line_each(tmp_path: Path) -> None:
    table = (
        '[jobs.hook]\nkind = "webhook"\nfrom = "nope"\nurl = "ftp://x"\nsecret = "abc"\n'
        'on_exhausted = "drop"\nretry_schedule = ["soon"]\nbatch = 0\nstart = "later"\n'
    )
    path = _config(tmp_path, table)
    with pytest.raises(ConfigError) as caught:
        load(path, {}, {})
    text = "\n".join(caught.value.problems)
    for expected in (
        "jobs.hook.from: no job named 'nope'", "jobs.hook.url: must be an http(s) URL",
        "jobs.hook.secret: secret 1 does not start", "jobs.hook.on_exhausted",
        "jobs.hook.retry_schedule", "jobs.hook.batch: must be at least 1", "jobs.hook.start",
    ):  # fmt: skip
        assert expected in text
    assert "abc" not in text


def test_the_example_receiver_refuses_a_lower_fencing_token_and_takes_a_retry_once() -> None:
    from ingestion.testing.receiver import Receiver

    receiver = Receiver(SECRET)

    def post(msg_id: str, token: int, seq: int) -> int:
        body = envelope("t", "x", msg_id, token, json.dumps({"seq": seq})).encode()
        ts = int(datetime.datetime.now(datetime.UTC).timestamp())
        headers = {"webhook-id": msg_id, "webhook-timestamp": str(ts), "webhook-fencing-token": str(token),
                   "webhook-signature": sign(parse_secrets(SECRET), msg_id, ts, body)}  # fmt: skip
        return receiver.accept(headers, body)[0]

    assert post("j:1", 3, 1) == 204
    assert post("j:2", 5, 2) == 204
    assert post("j:3", 4, 3) == 409  # a former leader's late POST: refused beside the write
    assert post("j:2", 5, 2) == 204  # a retry of what was taken: acknowledged, not written again
    assert [r["seq"] for r in receiver.records()] == [1, 2]
    assert (receiver.refused_stale, receiver.duplicates) == (1, 1)
    forged = {"webhook-id": "j:4", "webhook-timestamp": "1", "webhook-signature": "v1,AAAA"}
    bad = receiver.accept(forged, b"{}")
    assert bad[0] == 401 and receiver.refused_signature == 1


def test_a_webhook_jobs_keys_secret_and_url_credentials_stay_out_of_its_repr() -> None:
    import redis
    import structlog

    from actors.lease_store import LeaseStore
    from ingestion.testing.receiver import Receiver
    from ingestion.webhook.records import StreamRecords
    from ingestion.webhook.source import WebhookSource

    client = redis.Redis()  # (nothing is asked of it)
    keys = parse_secrets(SECRET)
    hook = WebhookSource(
        job="hook", from_job="ops", from_kind="horizon",
        records=StreamRecords(LeaseStore(client, "ops"), "g"), store=LeaseStore(client, "hook"),
        url="https://KEY123@wallet.example/in?token=KEY123", keys=keys,
        schedule=RetrySchedule.parse(DEFAULT_SCHEDULE), log=structlog.get_logger(),
    )  # fmt: skip
    shown = repr(hook)
    assert "KEY123" not in shown and repr(keys[0])[2:-1] not in shown and "wallet.example" in shown
    assert SECRET[6:] not in repr(Receiver(SECRET))
    client.close()
