"""Helpers for the simulator tests: a running simulator, a raw SSE reader, and a HorizonSource
following a simulator whose records it is checked against."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import httpx
import trio
import trio.lowlevel

from actors.source import Batch, Record, SourceFatalError
from ingestion.common.paging import token_key
from ingestion.horizon.pages import compact_json
from ingestion.horizon.source import HorizonSource
from ingestion.simulator import Simulator, SimulatorConfig, open_simulator

SAFETY_SECONDS = 5.0  # no test stream should take this long; fail rather than hang
SMALL = SimulatorConfig(ledger_interval=None, history_ledgers=4, ops_per_ledger=6, seed=7)


@attrs.frozen
class Frame:
    """One SSE frame as sent (field lines kept in order)."""

    fields: tuple[tuple[str, str], ...]

    def get(self, name: str) -> str | None:
        for key, value in self.fields:
            if key == name:
                return value
        return None


def parse_frames(raw: bytes) -> list[Frame]:
    frames = []
    for block in raw.decode().split("\n\n"):
        if not block:
            continue
        fields = tuple(
            (line.split(": ", 1)[0], line.split(": ", 1)[1] if ": " in line else "")
            for line in block.split("\n")
        )
        frames.append(Frame(fields))
    return frames


async def read_stream(
    url: str,
    *,
    headers: dict[str, str] | None = None,
    frames: int | None = None,
) -> tuple[httpx.Response, list[Frame], bool]:
    """Read an SSE response until it ends (or ``frames`` frames arrived).

    Returns the response, the complete frames, and whether the server ended the response.
    """
    raw = b""
    ended = False
    async with httpx.AsyncClient(timeout=SAFETY_SECONDS) as client:
        async with client.stream(
            "GET", url, headers={"Accept": "text/event-stream", **(headers or {})}
        ) as response:
            if response.status_code != 200:
                await response.aread()
                return response, [], True
            with trio.fail_after(SAFETY_SECONDS):
                iterator = response.aiter_raw()
                while True:
                    try:
                        chunk = await iterator.__anext__()
                    except (StopAsyncIteration, httpx.RemoteProtocolError, httpx.ReadError):
                        ended = True  # cleanly, or dropped in the middle of the body
                        break
                    raw += chunk
                    complete = raw[: raw.rfind(b"\n\n") + 2] if b"\n\n" in raw else b""
                    if frames is not None and len(parse_frames(complete)) >= frames:
                        raw = complete
                        break
    complete = raw[: raw.rfind(b"\n\n") + 2] if b"\n\n" in raw else b""
    return response, parse_frames(complete), ended


async def running(config: SimulatorConfig = SMALL) -> AsyncIterator[Simulator]:
    async with open_simulator(config) as sim:
        yield sim


REPO = Path(__file__).resolve().parents[2]


@asynccontextmanager
async def simulator_process(*flags: str) -> AsyncIterator[tuple[trio.Process, dict[str, Any]]]:
    """``python -m ingestion simulate FLAGS`` as a child process: yields it and the JSON line it
    announced once listening; killed on the way out if still running."""
    code = "import sys; from ingestion.cli.simulate import main; sys.exit(main(sys.argv[1:]))"
    proc = await trio.lowlevel.open_process(
        [sys.executable, "-c", code, *flags],
        stdout=subprocess.PIPE,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        assert proc.stdout is not None
        with trio.fail_after(15):
            line = b""
            while not line.endswith(b"\n"):
                line += await proc.stdout.receive_some(1)
        yield proc, json.loads(line)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


def source_for(urls: str | list[str], **settings: Any) -> HorizonSource:
    """A HorizonSource with short timeouts and retries (``settings`` override them)."""
    defaults: dict[str, Any] = {
        "connect_timeout": 2.0,
        "read_timeout": 2.0,
        "stream_idle_timeout": 5.0,
        "retry_base": 0.02,
        "retry_cap": 0.2,
        "retry_after_cap": 0.2,
    }
    defaults.update(settings)
    return HorizonSource(urls, **defaults)


class Follower:
    """Runs ``source.stream(cursor)`` in the background and records every batch."""

    def __init__(self) -> None:
        self.batches: list[Batch] = []
        self.records: list[Record] = []
        self.error: BaseException | None = None
        self._changed = trio.Event()

    async def run(self, source: HorizonSource, cursor: str) -> None:
        try:
            async with source.stream(cursor) as batches:
                async for batch in batches:
                    self.batches.append(batch)
                    self.records.extend(batch.records)
                    self._changed.set()
                    self._changed = trio.Event()
        except SourceFatalError as exc:
            self.error = exc
            self._changed.set()

    async def wait_for(self, count: int, within: float = 15.0) -> None:
        with trio.fail_after(within):
            while len(self.records) < count and self.error is None:
                await self._changed.wait()


@asynccontextmanager
async def following(
    source: HorizonSource, cursor: str
) -> AsyncIterator[tuple[Follower, trio.Nursery]]:
    follower = Follower()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(follower.run, source, cursor)
        yield follower, nursery
        nursery.cancel_scope.cancel()


def check_exact(got: list[Record], expected: list[dict[str, Any]]) -> None:
    """Same records in the same order; bodies exactly as the simulator streams them."""
    assert [r.paging_token for r in got] == [e["paging_token"] for e in expected]
    for record, want in zip(got, expected, strict=True):
        assert record.body == compact_json(want), record.paging_token
    keys = [token_key(r.paging_token) for r in got]
    assert all(a < b for a, b in itertools.pairwise(keys))


def after(sim: Simulator, resource: str, cursor: str) -> list[dict[str, Any]]:
    key = token_key(cursor)
    return [r for r in sim.records(resource) if token_key(r["paging_token"]) > key]


async def close_ledgers(sim: Simulator, n: int) -> None:
    for _ in range(n):
        sim.close_ledger()
        await trio.lowlevel.checkpoint()
