"""deploy/systemd: the unit template passes systemd-analyze, and a real node process speaks the
sd_notify protocol to a real NOTIFY_SOCKET (READY=1 once serving, STOPPING=1 on SIGTERM)."""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import tempfile
from pathlib import Path

import httpx
import pytest
import trio

from ingestion.node.sd_notify import notify
from ingestion.testing.cluster import open_cluster
from ingestion.testing.local_redis import free_port
from tests.support.deploy import DEPLOY

UNIT = DEPLOY / "systemd" / "ingestion@.service"


def unit_settings(text: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        if "=" in line and not line.startswith(("#", "[")):
            key, value = line.split("=", 1)
            out.setdefault(key.strip(), []).append(value.strip())
    return out


def test_the_unit_is_a_notify_service_stopped_gracefully_and_not_restarted_on_bad_config() -> None:
    settings = unit_settings(UNIT.read_text())
    assert settings["Type"] == ["notify"]
    assert settings["KillSignal"] == ["SIGTERM"]
    assert settings["RestartPreventExitStatus"] == ["2"]
    assert int(settings["TimeoutStopSec"][0]) >= 10  # a drain is a commit and a release


def test_systemd_analyze_verify_accepts_the_unit(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed: only this check is skipped")
    # A root of its own: the unit, an executable where ExecStart points, and the host's targets.
    units = tmp_path / "etc" / "systemd" / "system"
    units.mkdir(parents=True)
    shutil.copy(UNIT, units)
    [exec_start] = unit_settings(UNIT.read_text())["ExecStart"]
    binary = tmp_path / exec_start.split()[0].lstrip("/")
    binary.parent.mkdir(parents=True)
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    for system in (Path("/usr/lib/systemd/system"), Path("/lib/systemd/system")):
        for target in system.glob("*.target"):
            if not (units / target.name).exists():
                shutil.copy(target, units)
    result = subprocess.run(
        [analyze, "verify", f"--root={tmp_path}", "--man=no", "ingestion@a.service"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0 and not result.stderr.strip(), result.stderr


def test_notify_sends_one_datagram_to_a_path_or_an_abstract_socket() -> None:
    assert notify("READY=1", {}) is False  # not under systemd: nothing to do
    name = f"ingestion-test-{free_port()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as server:
        server.bind("\0" + name)
        assert notify("READY=1", {"NOTIFY_SOCKET": "@" + name}) is True
        assert server.recv(4096) == b"READY=1"
    with pytest.raises(OSError, match="only unix socket"):
        notify("READY=1", {"NOTIFY_SOCKET": "vsock:2:1234"})
    with pytest.raises(OSError):
        notify("READY=1", {"NOTIFY_SOCKET": "/nonexistent/notify"})


async def test_a_node_says_ready_once_serving_and_stopping_on_sigterm(job: str) -> None:
    directory = tempfile.mkdtemp(prefix="notify-", dir="/tmp")  # unix socket paths are short
    path = f"{directory}/notify"
    sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        await sock.bind(path)
        async with open_cluster(job) as cluster:
            port = free_port()
            await cluster.start_node(
                "a", env={"NOTIFY_SOCKET": path}, extra=["--metrics-port", str(port)], wait=False
            )
            with trio.fail_after(30):
                assert await sock.recv(4096) == b"READY=1"
            # Ready means serving: the probes answer already, and the node campaigns.
            async with httpx.AsyncClient(timeout=2.0) as client:
                assert (await client.get(f"http://127.0.0.1:{port}/livez")).status_code == 200
            await cluster.joined("a", since=0.0)
            cluster.signal("a", signal.SIGTERM)
            with trio.fail_after(10):
                assert await sock.recv(4096) == b"STOPPING=1"
            assert await cluster.exited("a") == 0
            assert cluster.log.of("node-stopped", "a") and not cluster.log.of("sd-notify-failed")
    finally:
        sock.close()
        shutil.rmtree(directory, ignore_errors=True)
