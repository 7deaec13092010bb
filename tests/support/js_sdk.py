"""js-stellar-sdk (npm ``@stellar/stellar-sdk``) as a client in the tests: installed by
``scripts/js-sdk`` into a cache directory outside the repository on first use, and driven through
``tests/support/get_events.cjs`` (``rpc.Server(url, {allowHttp: true}).getEvents``)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "support" / "get_events.cjs"


def node_modules() -> Path:
    """The SDK's ``node_modules``, installed when missing (the test is skipped without node/npm)."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip("js-stellar-sdk needs node and npm (Debian: apt-get install -y nodejs npm)")
    done = subprocess.run(
        [str(ROOT / "scripts" / "js-sdk")], capture_output=True, text=True, timeout=300, check=True
    )
    return Path(done.stdout.strip().splitlines()[-1])


def get_events_pages(modules: Path, url: str, requests: list[dict[str, Any]]) -> list[Any]:
    """For each request, every page ``getEvents`` gives from its start on, as the SDK parsed them
    (events' ScVals back to base64, contract ids as strkeys); a refusal as ``{"error": ...}``."""
    done = subprocess.run(
        ["node", str(SCRIPT)],
        input=json.dumps({"url": url, "requests": requests}),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        env={**os.environ, "NODE_PATH": str(modules)},
    )
    return list(json.loads(done.stdout))
