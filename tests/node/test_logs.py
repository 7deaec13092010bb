"""Logging: JSON lines with the keys in docs/REFERENCE.md, console rendering, levels, no passwords."""

from __future__ import annotations

import io
import json
import re
from datetime import datetime

import pytest
import structlog

from ingestion.node.logs import configure_logging, node_logger, redact


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture(autouse=True)
def _restore_structlog():  # type: ignore[no-untyped-def]
    yield
    structlog.reset_defaults()
    structlog.contextvars.clear_contextvars()


def test_json_lines_carry_event_timestamp_level_node_and_job() -> None:
    out = io.StringIO()
    configure_logging("info", "json", out)
    node_logger("n1", "horizon").info("became-leader", token=3, previous_node=None)
    line = json.loads(out.getvalue())
    assert line["event"] == "became-leader" and line["level"] == "info"
    assert (line["node"], line["job"], line["token"], line["previous_node"]) == ("n1", "horizon", 3, None)
    stamp = datetime.fromisoformat(line["timestamp"])
    assert stamp.utcoffset() is not None and stamp.utcoffset().total_seconds() == 0  # type: ignore[union-attr]


def test_auto_format_is_json_when_piped_and_console_on_a_terminal() -> None:
    piped, tty = io.StringIO(), Tty()
    configure_logging("info", "auto", piped)
    node_logger("n", "j").info("standby", leader="a")
    json.loads(piped.getvalue())
    configure_logging("info", "auto", tty)
    node_logger("n", "j").info("standby", leader="a")
    text = re.sub(r"\x1b\[[0-9;]*m", "", tty.getvalue())  # colours on a terminal
    assert "standby" in text and "leader=a" in text
    with pytest.raises(json.JSONDecodeError):
        json.loads(text)


def test_console_format_can_be_asked_for_without_a_terminal() -> None:
    out = io.StringIO()
    configure_logging("info", "console", out)
    node_logger("n", "j").warning("renew-failed", token=2)
    assert "renew-failed" in out.getvalue() and "\x1b[" not in out.getvalue()  # no colours in a file


def test_log_level_filters_lower_levels() -> None:
    out = io.StringIO()
    configure_logging("warning", "json", out)
    log = node_logger("n", "j")
    log.info("quiet")
    log.debug("quieter")
    log.warning("loud")
    assert [json.loads(x)["event"] for x in out.getvalue().splitlines()] == ["loud"]


def test_passwords_in_urls_never_reach_a_log_line() -> None:
    out = io.StringIO()
    configure_logging("debug", "json", out)
    log = node_logger("n", "j")
    log.info("node-starting", redis="rediss://ingest:s3cret@redis:6380/0", horizon=["http://a:b4d@h"])
    try:
        raise RuntimeError("cannot connect to redis://:s3cret@10.0.0.1:6379")
    except RuntimeError:
        log.exception("boom")
    text = out.getvalue()
    assert "s3cret" not in text and "b4d" not in text
    assert "rediss://ingest:***@redis:6380/0" in text


def test_redact_leaves_ordinary_text_alone() -> None:
    assert redact("cursor=123-4 leader=a") == "cursor=123-4 leader=a"
    assert redact("redis://127.0.0.1:6379/0") == "redis://127.0.0.1:6379/0"
    assert redact("redis://h:1/0?password=x&db=1") == "redis://h:1/0?password=***&db=1"


def test_url_tokens_and_userinfo_are_masked_by_every_redaction() -> None:
    """Issue 46: only ``user:password@`` and ``?password=`` were masked; a provider's key in a
    URL (``https://KEY@host``, ``?token=``, ``?apikey=``) was printed whole."""
    from ingestion.config import redact_url
    from ingestion.postgres.connection import redact as redact_sink

    cases = {
        "https://KEY123@rpc.example/soroban": "https://***@rpc.example/soroban",
        "https://horizon.example/?token=KEY123&x=1": "https://horizon.example/?token=***&x=1",
        "https://rpc.example/v1?apikey=KEY123": "https://rpc.example/v1?apikey=***",
        "wss://h.example/?access_token=KEY123#f": "wss://h.example/?access_token=***#f",
        "postgresql://u:KEY123@db/x?sslpassword=KEY123": "postgresql://u:***@db/x?sslpassword=***",
        "redis://u:p@ss@h:6379/0": "redis://u:***@h:6379/0",
    }
    for shown in (redact, redact_url, redact_sink):
        assert {url: shown(url) for url in cases} == cases, shown
    assert redact("failed: https://KEY123@h.example/x?api_key=KEY123 (503)") == (
        "failed: https://***@h.example/x?api_key=*** (503)"
    )
    assert redact("paging_token=12 fencing_token=7") == "paging_token=12 fencing_token=7"


def test_an_http_error_is_described_without_the_key_in_its_url() -> None:
    """``describe`` feeds logs, ``webhooks status`` (``last_error``), dead letters and audit
    entries; an HTTP error's message names the URL it was for, key and all."""
    import httpx

    from ingestion.common.http import describe

    request = httpx.Request("GET", "https://KEY123@horizon.example/ledgers?apikey=KEY123")
    failed = httpx.HTTPStatusError(
        "Client error '403 Forbidden' for url 'https://KEY123@horizon.example/ledgers?apikey=KEY123'",
        request=request, response=httpx.Response(403, request=request),
    )  # fmt: skip
    shown = describe(failed)
    assert "KEY123" not in shown and shown.startswith("HTTPStatusError: Client error '403 Forbidden'")
