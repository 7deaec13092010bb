"""A live batch's events as the streams render them (ingestion/api/stream_reads.py): the feed hands
the same :class:`StoredEvent` to every subscriber, so ``xdrFormat: json`` (its ScVals decoded) is
rendered once for all of them, and equal to what ``getEvents`` serves."""

from __future__ import annotations

import orjson
import pytest

from ingestion.api.query import json_format
from ingestion.api.stream_reads import StoredEvent
from ingestion.rpc.protocol import RpcError
from ingestion.testing.api_events import make_events


def test_json_is_rendered_once_for_every_subscriber_and_base64_is_the_record() -> None:
    e = next(x for x in make_events(1, 20) if '"topic":' in x.text)
    stored = StoredEvent(e.id, e.text)
    first = stored.render("json")
    assert first == json_format(e.text) and b'"topicJson"' in first
    assert all(stored.render("json") is first for _ in range(99))  # the same bytes: decoded once
    assert stored.render("base64") == e.text.encode()


def test_a_record_that_does_not_decode_raises_each_time_it_is_asked() -> None:
    record = orjson.loads(next(x for x in make_events(1, 20) if '"topic":' in x.text).text)
    record["topic"] = ["not-xdr"]
    stored = StoredEvent(record["id"], orjson.dumps(record).decode())
    for _ in range(2):
        with pytest.raises(RpcError):
            stored.render("json")
