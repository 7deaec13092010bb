"""The events API this node serves, on its console (issue 48, "Operable"; docs/API.md): requests by
method and outcome, each method's latency p50 and p99 (the histogram's bucket bound), the
subscriptions served now and the window of ledgers last served. Taken from the node's own API
metrics (:meth:`ingestion.api.server.ApiApp.console_view`): no Redis command, no store read.
Pure: the snapshot in, HTML out, every value escaped."""

from __future__ import annotations

import html
from collections.abc import Mapping
from typing import Any


def _e(value: object) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def _ms(value: Any) -> str:
    return "" if value is None else f"≤ {value} ms"


def api_section(api: Mapping[str, Any] | None) -> str:
    """The overview's section (empty when this node serves no API: ``api.port`` 0)."""
    if not api:
        return ""
    subscribers = api.get("subscribers")
    facts = [
        ("job", api.get("job")),
        ("oldest ledger served", api.get("oldest_ledger")),
        ("latest ledger served", api.get("latest_ledger")),
        ("subscribers", "streaming off" if subscribers is None else subscribers),
    ]
    rows = "".join(
        f'<tr><th>{_e(label)}</th><td data-col="{_e(label.split()[0])}">{_e(value)}</td></tr>'
        for label, value in facts
    )
    latency = api.get("latency") or {}
    methods = "".join(
        f'<tr data-method="{_e(r["method"] or "(unparsed)")}" data-outcome="{_e(r["outcome"])}">'
        f"<td>{_e(r['method'] or '(unparsed)')}</td><td>{_e(r['outcome'])}</td>"
        f'<td data-col="count">{_e(r["count"])}</td></tr>'
        for r in api.get("requests") or ()
    )
    times = "".join(
        f'<tr data-method="{_e(m or "(unparsed)")}"><td>{_e(m or "(unparsed)")}</td>'
        f'<td>{_e(t["count"])}</td><td data-col="p50">{_e(_ms(t["p50_ms"]))}</td>'
        f'<td data-col="p99">{_e(_ms(t["p99_ms"]))}</td></tr>'
        for m, t in sorted(latency.items())
    )
    return (
        "<h1>Events API on this node</h1>"
        f'<table id="api"><tbody>{rows}</tbody></table>'
        '<h2>Requests</h2><table id="api-requests"><thead><tr><th>method</th><th>outcome</th>'
        f"<th>requests</th></tr></thead><tbody>{methods}</tbody></table>"
        '<h2>Latency</h2><table id="api-latency"><thead><tr><th>method</th><th>requests</th>'
        f"<th>p50</th><th>p99</th></tr></thead><tbody>{times}</tbody></table>"
    )
