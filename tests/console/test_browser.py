"""The operator console in a real headless Chromium (Debian's), against three real node processes.

The page is opened on a standby node (any node shows the whole cluster). Its leader is SIGKILLed;
the page, never reloaded, moves the job's ``data-leader`` to the node that took over, shows the
killed node down, and the job's page shows the takeover in the audit. Values planted in Redis by
hand (a job name and cursor made of markup) show as text: no dialog opens, no script error.
"""

from __future__ import annotations

import json

import httpx
import pytest

from actors.lease_store import job_keys
from ingestion.testing.cluster import open_cluster
from ingestion.testing.local_redis import free_port
from ingestion.testing.wait import wait_until
from tests.support.browser import open_browser

pytestmark = pytest.mark.slow
TTL_MS = 1500
EVIL = '<img src=x onerror="alert(1)">'


def leader_of(job: str) -> str:
    """A page expression: the job row's data-leader (None while the row is missing)."""
    selector = json.dumps(f"tr[data-job={json.dumps(job)}]")
    return f"(document.querySelector({selector})?.dataset.leader ?? null)"


async def test_the_console_follows_a_failover_live_and_shows_the_audit(job: str) -> None:
    async with open_cluster(job, ttl_ms=TTL_MS) as c, open_browser() as browser:
        ports = {name: free_port() for name in ("a", "b", "c")}
        for name, port in ports.items():
            await c.start_node(name, extra=["--metrics-port", str(port)])
            if name == "a":
                await c.log.wait_for("became-leader", "a")
        await c.log.wait_for("standby", "c")
        url = f"http://127.0.0.1:{ports['c']}/"
        await browser.call(lambda p: p.goto(url))
        assert await browser.call(lambda p: p.evaluate(leader_of(job))) == "a"
        # the live feed is running before the fault
        live = "document.getElementById('live').textContent.includes('live')"
        await browser.call(lambda p: p.wait_for_function(live))

        killed_at = await c.kill("a")
        taken = await c.log.wait_for("became-leader", since=killed_at, within=TTL_MS / 1000 + 5)
        new = taken.node
        assert new in ("b", "c")
        # no reload: the events feed moves the row to the new leader and marks a down
        await browser.call(lambda p: p.wait_for_function(f"{leader_of(job)} === {json.dumps(new)}"))
        await browser.call(lambda p: p.wait_for_function(
            "document.querySelector('tr[data-node=\"a\"]')?.dataset.live === 'no'"
        ))  # fmt: skip
        row = await browser.call(lambda p: p.inner_text(f'tr[data-job="{job}"]'))
        assert new in row and str(taken.fields["token"]) in row

        # the job's page: the takeover in the audit, newest first
        await browser.call(lambda p: p.click(f'tr[data-job="{job}"] a'))
        audit = await browser.call(lambda p: p.inner_text("#audit tbody"))
        first = audit.splitlines()[0]
        assert "became-leader" in first and new in first and "a" in first.split("\t")[4], audit

        # markup planted in Redis is shown as text, on the server's page and by the live feed
        c.client.hset(job_keys(EVIL)["cursor"], mapping={"cursor": EVIL, "token": 1})
        def planted_seen() -> bool:  # by the console's shared read, which renders the page too
            jobs = httpx.get(f"{url}console/state", timeout=5).json()["jobs"]
            return any(j["job"] == EVIL for j in jobs)

        await wait_until(planted_seen, 10, what="the planted job in the console's state")
        await browser.call(lambda p: p.goto(url))
        assert await browser.call(lambda p: p.evaluate(leader_of(EVIL))) == ""  # there, leaderless
        cells = await browser.call(lambda p: p.inner_text(f"tr[data-job={json.dumps(EVIL)}]"))
        assert cells.count(EVIL) == 2  # its name and its cursor, as text
        c.client.hset(job_keys(EVIL + "2")["cursor"], mapping={"cursor": EVIL, "token": 1})
        await browser.call(lambda p: p.wait_for_function(f"{leader_of(EVIL + '2')} === ''"))
        assert await browser.call(lambda p: p.locator("img").count()) == 0
        assert browser.dialogs == [] and browser.errors == []
