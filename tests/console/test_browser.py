"""The operator console in a real headless Chromium (Debian's), against three real node processes.

The page is opened on a standby node (any node shows the whole cluster). Its leader is SIGKILLed;
the page, never reloaded, moves the job's ``data-leader`` to the node that took over, shows the
killed node down, and the job's page shows the takeover in the audit. Values planted by hand (a job
name and cursor made of markup in Redis, a presence report of markup on the channel) show as text:
no dialog opens, no script error. Then a leaderless job says why, a failing webhook endpoint shows
its attempts and dead letters, and the actions are refused without the console token and carried
out by the job's leader with it (a replay of the dead letters, a hand-over).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import httpx
import pytest
import trio

from actors.lease_store import job_keys, read_states
from ingestion.common.keyspace import PRESENCE_CHANNEL, webhook_keys
from ingestion.testing.cluster import open_cluster
from ingestion.testing.local_redis import free_port
from ingestion.testing.receiver import Fault, Receiver, serve_receiver
from ingestion.testing.wait import wait_until
from tests.support.browser import Browser, open_browser

pytestmark = pytest.mark.slow
TTL_MS = 1500
EVIL = '<img src=x onerror="alert(1)">'
SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
TOKEN = "console-token-for-the-test"


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
        # and by the live feed: a report on the presence channel naming markup (node, job, reason)
        planted = {"kind": EVIL, "role": "standby", "token": 1, "leader": EVIL, "held_off": EVIL,
                   "source_up": True}  # fmt: skip
        report = {"version": EVIL, "every_ms": 60_000, "jobs": {EVIL + "2": planted}}
        c.client.publish(PRESENCE_CHANNEL, f"{EVIL}|{2**50}|{json.dumps(report)}")
        await browser.call(lambda p: p.wait_for_function(f"{leader_of(EVIL + '2')} === ''"))
        why = await browser.call(lambda p: p.inner_text(f"tr[data-job={json.dumps(EVIL + '2')}]"))
        assert why.count(EVIL) >= 3, why  # its name, its kind, and the host's reason, as text
        assert await browser.call(lambda p: p.locator("img").count()) == 0
        assert browser.dialogs == [] and browser.errors == []


def hook_config(path: Path, port: int, job: str) -> Path:
    """A Horizon job, a webhook job of it that dead-letters at once, and a job whose PostgreSQL
    sink is unreachable (so it has no leader, and says why)."""
    path.write_text(
        f'[jobs.{job}]\nkind = "horizon"\nresource = "/operations"\n'
        f'[jobs.{job}-hook]\nkind = "webhook"\nfrom = "{job}"\nurl = "http://127.0.0.1:{port}/in"\n'
        f'secret = "{SECRET}"\nstart = "first"\ntimeout_ms = 800\nretry_schedule = ["20ms"]\n'
        'on_exhausted = "dead-letter"\n'
        f'[jobs.{job}-pg]\nkind = "horizon"\nresource = "/operations"\n'
        f'sink = "postgresql://ingestion:pw@127.0.0.1:{free_port()}/nothing"\n'
    )
    return path


async def screenshot(browser: Browser, name: str) -> None:
    """With CONSOLE_SCREENSHOTS=DIR, keep the page as DIR/name (docs/ holds the ones the docs show:
    ``CONSOLE_SCREENSHOTS=docs .venv/bin/python -m pytest tests/console/test_browser.py``)."""
    where = os.environ.get("CONSOLE_SCREENSHOTS")
    if where:
        await browser.call(lambda p: p.set_viewport_size({"width": 1400, "height": 900}))
        await browser.call(lambda p: p.screenshot(path=str(Path(where) / name), full_page=True))


def text_of(selector: str) -> str:
    return f"(document.querySelector({json.dumps(selector)})?.textContent ?? '')"


async def test_a_leaderless_job_says_why_and_a_dead_letter_is_replayed_from_the_page_with_the_token(
    job: str, tmp_path: Path
) -> None:
    hook, pg = f"{job}-hook", f"{job}-pg"
    receiver = Receiver(SECRET, fault=Fault(status=500))
    async with trio.open_nursery() as outer:
        port = await outer.start(serve_receiver, receiver)
        config = hook_config(tmp_path / "config.toml", port, job)
        async with open_cluster(job, ttl_ms=TTL_MS) as c, open_browser() as browser:
            ports = {name: free_port() for name in ("a", "b")}
            for name, metrics in ports.items():
                env = {"INGESTION_OBSERVE_CONSOLE_TOKEN": TOKEN} if name == "a" else {}
                await c.start_node(name, env=env, extra=["--config", str(config), "--job", hook, "--job", pg,
                                                         "--metrics-port", str(metrics)])  # fmt: skip
            a, b = (f"http://127.0.0.1:{ports[n]}" for n in ("a", "b"))

            # the job whose sink nobody reaches: leaderless, and why, on the overview
            await browser.call(lambda p: p.goto(f"{a}/"))
            why = text_of(f'tr[data-job="{pg}"] td[data-col="why"]')
            # (both nodes: b may still be starting when a has said why)
            held = " && ".join(f"{why}.includes('{n}: held off: sink-unreachable')" for n in "ab")
            await browser.call(lambda p: p.wait_for_function(held))
            shown = await browser.call(lambda p: p.evaluate(why))
            assert "a: held off" in shown and "b: held off" in shown and "pw" not in shown, shown
            assert await browser.call(lambda p: p.evaluate(leader_of(pg))) == ""
            await screenshot(browser, "console-overview.png")

            # the failing endpoint: attempts with their status, and a dead letter, on the hook's page
            await wait_until(lambda: c.client.xlen(job_keys(hook)["events"]) >= 1, 20, what="a dead letter")
            await browser.call(lambda p: p.goto(f"{b}/console/job/{hook}"))
            attempts = await browser.call(lambda p: p.inner_text("#attempts tbody"))
            assert "500" in attempts and "5xx" in attempts, attempts
            dead = await browser.call(lambda p: p.inner_text("#dead tbody"))
            assert dead.strip(), "no dead letter shown"
            await screenshot(browser, "console-webhook.png")
            # b has no token: every action is refused, and says so
            await browser.call(lambda p: p.click('button[data-action="replay-dead-letters"]'))
            await browser.call(lambda p: p.wait_for_function(f"{text_of('#result')}.includes('403')"))
            assert "read-only" in await browser.call(lambda p: p.evaluate(text_of("#result")))

            # a has one: refused without it, carried out by the leader with it
            await browser.call(lambda p: p.goto(f"{a}/console/job/{hook}"))
            await browser.call(lambda p: p.click('button[data-action="replay-dead-letters"]'))
            await browser.call(lambda p: p.wait_for_function(f"{text_of('#result')}.includes('401')"))
            receiver.fault = None  # the endpoint answers again
            letters = c.client.xlen(job_keys(hook)["events"])
            await browser.call(lambda p: p.fill("#token", TOKEN))
            await browser.call(lambda p: p.fill("#operator", "alice"))
            await browser.call(lambda p: p.click('button[data-action="replay-dead-letters"]'))
            await browser.call(lambda p: p.wait_for_function(f"{text_of('#result')}.includes('202')"))
            await wait_until(lambda: c.client.hlen(webhook_keys(hook)["replayed"]) >= letters, 20,
                             what="the dead letters replayed")  # fmt: skip
            # the page follows by itself: the replay in the audit, with who asked
            audit = text_of("#audit tbody")
            await browser.call(lambda p: p.wait_for_function(f"{audit}.includes('operator-request')"))
            row = await browser.call(lambda p: p.evaluate(audit))
            assert "alice" in row and "via a" in row, row

            # hand the Horizon job over from its page: another node leads it, the audit says who asked
            before = read_states(c.client, [job])[0].leader
            await browser.call(lambda p: p.goto(f"{a}/console/job/{job}"))
            await browser.call(lambda p: p.click('button[data-action="handover"]'))
            await browser.call(lambda p: p.wait_for_function(f"{text_of('#result')}.includes('202')"))
            other = "b" if before == "a" else "a"
            await browser.call(lambda p: p.wait_for_function(f"{leader_of(job)} === {json.dumps(other)}"))
            await browser.call(lambda p: p.wait_for_function(f"{audit}.includes('handover-requested')"))
            # (the browser logs the refused requests above as console errors: nothing else)
            assert browser.dialogs == []
            assert [e for e in browser.errors if "401" not in e and "403" not in e] == [], browser.errors
        outer.cancel_scope.cancel()
