"""Helpers for the simulator tests: a running simulator and a raw SSE reader."""

from __future__ import annotations

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


REPO = Path(__file__).resolve().parent.parent


@asynccontextmanager
async def simulator_process(*flags: str) -> AsyncIterator[tuple[trio.Process, dict[str, Any]]]:
    """``python -m ingestion simulate FLAGS`` as a child process: yields it and the JSON line it
    announced once listening; killed on the way out if still running."""
    code = "import sys; from ingestion.simulator.cli import main; sys.exit(main(sys.argv[1:]))"
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
