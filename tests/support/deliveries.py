"""Webhook deliveries as a genuine deliverer signs them (docs/WEBHOOKS.md's format), for tests of
receivers: the example receiver's own (tests/webhook) and the documented command's (tests/docs)."""

from __future__ import annotations

import json
import time

from ingestion.webhook.core import message_id, parse_secrets, sign

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


def delivery(
    record: int, token: int, header: int | None = None, source_job: str = "ops"
) -> tuple[dict[str, str], bytes]:
    """A delivery of ``source_job``'s record ``record`` by a leader holding fencing token
    ``token``, signed with :data:`SECRET` now; ``header``: the unsigned ``webhook-fencing-token``
    as sent (or altered)."""
    msg_id = message_id(source_job, str(record))
    payload = {"type": "stellar.horizon.payment", "timestamp": "2026-12-04T00:00:00Z", "id": msg_id,
               "fencing_token": token, "data": {"id": str(record), "paging_token": str(record)}}  # fmt: skip
    body = json.dumps(payload, separators=(",", ":")).encode()
    ts = int(time.time())
    headers = {
        "webhook-id": msg_id, "webhook-timestamp": str(ts),
        "webhook-signature": sign(parse_secrets(SECRET), msg_id, ts, body),
        "webhook-fencing-token": str(token if header is None else header),
    }  # fmt: skip
    return headers, body
