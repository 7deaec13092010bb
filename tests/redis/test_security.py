"""Redis as people run it: requirepass, ACL users and TLS, each against a real redis-server started
for the test (certificates made by trustme); clear errors naming the setting; no password leaks."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import structlog
import trio
import trustme
from structlog.testing import capture_logs

from actors.lease_store import RedisUnavailable
from actors.observe import NodeObserver
from actors.source import SyntheticSource
from actors.supervisor import NodeSpec, run_node
from ingestion.config import Settings
from ingestion.node.build import build_store
from ingestion.testing.local_redis import LocalRedis, free_port, start_retrying
from tests.support.nodes import FAST_TIMING, Recorder
from tests.support.ports import closed_port

PASSWORD = "Sup3r-S3cret-pw"
ACL_PASSWORD = "acl-Pa55-word"
LIVE = SyntheticSource(total=None, batch_size=5, interval=0.02)


@pytest.fixture(scope="module")
def password_redis() -> Iterator[LocalRedis]:
    server = LocalRedis(password=PASSWORD, extra_args=("--requirepass", PASSWORD)).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def acl_redis() -> Iterator[LocalRedis]:
    server = LocalRedis(username="ingest", password=ACL_PASSWORD, extra_args=(
        "--user", "default", "off",
        "--user", "ingest", "on", f">{ACL_PASSWORD}", "~ingestion:*", "&*", "+@all",
    )).start()  # fmt: skip
    yield server
    server.stop()


def start_with_tls_port(build: Callable[[int], LocalRedis]) -> tuple[LocalRedis, int]:
    """``build(tls_port)`` started, with a TLS port picked afresh whenever one was taken."""
    tls_ports: list[int] = []

    def fresh() -> LocalRedis:
        tls_ports.append(free_port())
        return build(tls_ports[-1])

    server = start_retrying(fresh)
    return server, tls_ports[-1]


class TlsRedis:
    def __init__(self, server: LocalRedis, tls_port: int, files: dict[str, str]) -> None:
        self.server, self.tls_port, self.files = server, tls_port, files

    def url(self, scheme: str = "rediss", auth: str = f":{PASSWORD}@") -> str:
        return f"{scheme}://{auth}127.0.0.1:{self.tls_port}/0"


@pytest.fixture(scope="module")
def tls_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsRedis]:
    """TLS on its own port (client certificates required), with a password; plus an unrelated CA."""
    d = tmp_path_factory.mktemp("tls")
    ca, other_ca = trustme.CA(), trustme.CA()
    server_cert, client_cert = ca.issue_cert("127.0.0.1"), ca.issue_cert("ingestion-client")
    files = {name: str(d / f"{name}.pem") for name in
             ("ca", "other_ca", "server_cert", "server_key", "client_cert", "client_key")}  # fmt: skip
    ca.cert_pem.write_to_path(files["ca"])
    other_ca.cert_pem.write_to_path(files["other_ca"])
    server_cert.cert_chain_pems[0].write_to_path(files["server_cert"])
    server_cert.private_key_pem.write_to_path(files["server_key"])
    client_cert.cert_chain_pems[0].write_to_path(files["client_cert"])
    client_cert.private_key_pem.write_to_path(files["client_key"])
    server, tls_port = start_with_tls_port(lambda tls_port: LocalRedis(password=PASSWORD, extra_args=(
        "--requirepass", PASSWORD,
        "--tls-port", str(tls_port),
        "--tls-cert-file", files["server_cert"],
        "--tls-key-file", files["server_key"],
        "--tls-ca-cert-file", files["ca"],
        "--tls-auth-clients", "yes",
    )))  # fmt: skip
    yield TlsRedis(server, tls_port, files)
    server.stop()


def settings_for(url: str, **redis: str) -> Settings:
    return Settings.from_mapping({"redis": {"url": url, **redis}, "lease": {"ttl_ms": 1500}})


async def leads_and_commits(settings: Settings, job: str) -> None:
    """A node with the store built from ``settings`` becomes leader and commits."""
    rec = Recorder()
    observer = NodeObserver("secure", job)
    observer.listeners.append(rec.listener("secure"))
    spec = NodeSpec("secure", job, 1500, FAST_TIMING, 0.01, "0")
    store = build_store(settings)
    try:
        async with trio.open_nursery() as nursery:
            log = structlog.get_logger().bind(node="secure", job=job)
            handle = await nursery.start(run_node, store, LIVE, spec, log, observer)
            await rec.wait_for("committed", "secure", count=2, within=5)
            await handle.shutdown()
    finally:
        store.client.close()


async def test_requirepass_password_in_the_url_works(password_redis: LocalRedis, job: str) -> None:
    await leads_and_commits(settings_for(f"redis://:{PASSWORD}@127.0.0.1:{password_redis.port}/0"), job)


async def test_acl_user_and_password_in_the_url_work(acl_redis: LocalRedis, job: str) -> None:
    url = f"redis://ingest:{ACL_PASSWORD}@127.0.0.1:{acl_redis.port}/0"
    await leads_and_commits(settings_for(url), job)


async def test_rediss_verifies_the_server_and_presents_a_client_certificate(
    tls_redis: TlsRedis, job: str
) -> None:
    f = tls_redis.files
    settings = settings_for(
        tls_redis.url(), tls_ca_file=f["ca"], tls_cert_file=f["client_cert"],
        tls_key_file=f["client_key"],
    )  # fmt: skip
    await leads_and_commits(settings, job)


def _cases(tls: TlsRedis, password: LocalRedis, acl: LocalRedis) -> list[tuple[Settings, str, str]]:
    f = tls.files
    client = {"tls_cert_file": f["client_cert"], "tls_key_file": f["client_key"]}
    return [
        (settings_for(f"redis://:wrong-{PASSWORD}@127.0.0.1:{password.port}/0"),
         "authentication failed", f"redis://127.0.0.1:{password.port}/0"),
        (settings_for(f"redis://ingest:wrong-{ACL_PASSWORD}@127.0.0.1:{acl.port}/0"),
         "authentication failed", f"redis://ingest@127.0.0.1:{acl.port}/0"),
        (settings_for(tls.url(), tls_ca_file=f["other_ca"], **client),
         "TLS handshake failed", f"rediss://127.0.0.1:{tls.tls_port}/0"),
        (settings_for(tls.url("redis")),
         "connection closed by the server", f"redis://127.0.0.1:{tls.tls_port}/0"),
        (settings_for(f"redis://:{PASSWORD}@127.0.0.1:{closed_port()}/0"),
         "connection refused", "redis://127.0.0.1:"),
    ]  # fmt: skip


async def test_each_failure_names_the_setting_and_the_cause_but_never_the_password(
    tls_redis: TlsRedis, password_redis: LocalRedis, acl_redis: LocalRedis, job: str
) -> None:
    for settings, cause, where in _cases(tls_redis, password_redis, acl_redis):
        store = build_store(settings)
        try:
            with pytest.raises(RedisUnavailable) as caught:
                await store.acquire("n", 1500)
        finally:
            store.client.close()
        message = str(caught.value)
        assert message.startswith(f"redis.url {where}"), message
        assert cause in message, message
        assert PASSWORD not in message and ACL_PASSWORD not in message


async def test_a_node_that_cannot_authenticate_retries_with_backoff_and_never_leads(
    password_redis: LocalRedis, job: str
) -> None:
    settings = settings_for(f"redis://:nope-{PASSWORD}@127.0.0.1:{password_redis.port}/0")
    rec = Recorder()
    observer = NodeObserver("locked-out", job)
    observer.listeners.append(rec.listener("locked-out"))
    spec = NodeSpec("locked-out", job, 1500, FAST_TIMING, 0.01, "0")
    store = build_store(settings)
    with capture_logs() as logs:
        log = structlog.get_logger().bind(node="locked-out", job=job)
        async with trio.open_nursery() as nursery:
            handle = await nursery.start(run_node, store, LIVE, spec, log, observer)
            third = await rec.wait_for("redis-unavailable", "locked-out", count=3, within=5)
            first = rec.of("redis-unavailable")[0]
            assert third.at - first.at >= 0.1  # backed off, not a busy loop
            await handle.shutdown()
    store.client.close()
    assert not rec.of("became-leader")
    failures = [e for e in logs if e["event"] == "redis-unavailable"]
    assert [e["attempt"] for e in failures[:3]] == [1, 2, 3]
    assert "authentication failed" in failures[0]["error"]
    assert PASSWORD not in repr(logs)


def test_node_process_refuses_a_wrong_password_in_one_line_that_never_shows_it(
    password_redis: LocalRedis, tmp_path: Path
) -> None:
    """A password Redis refuses cannot be fixed by retrying: the node exits 2 before it logs or
    campaigns, with one line naming redis.url, the password blanked."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("INGESTION_")}
    url = f"redis://:wrong-{PASSWORD}@127.0.0.1:{password_redis.port}/0"
    proc = subprocess.run(
        [sys.executable, "-m", "ingestion", "--redis", url, "--horizon", f"http://127.0.0.1:{closed_port()}",
         "--node-id", "leaky", "--lease-ttl-ms", "1500", "--log-format", "json"],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=30,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert PASSWORD not in proc.stdout + proc.stderr
    assert proc.stderr.splitlines() == [
        f"ingestion: configuration error: redis.url redis://:***@127.0.0.1:{password_redis.port}/0: "
        "authentication failed (invalid username-password pair or user is disabled.): fix the user "
        "and password in redis.url"
    ]
    assert "became-leader" not in proc.stdout


async def test_rediss_sentinel_reaches_sentinels_and_the_primary_over_tls(
    tmp_path: Path, job: str
) -> None:
    """rediss+sentinel://: the sentinels are asked over TLS, and so is the primary they name
    (its TLS port: the sentinel itself monitors it with tls-replication), with the client
    certificate on both; min_replicas_acked is 0 (no replica in this deployment)."""
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    client = ca.issue_cert("ingestion-client")
    files = {name: str(tmp_path / f"{name}.pem") for name in
             ("ca", "cert", "key", "client_cert", "client_key")}  # fmt: skip
    ca.cert_pem.write_to_path(files["ca"])
    cert.cert_chain_pems[0].write_to_path(files["cert"])
    cert.private_key_pem.write_to_path(files["key"])
    client.cert_chain_pems[0].write_to_path(files["client_cert"])
    client.private_key_pem.write_to_path(files["client_key"])
    tls = ("--tls-cert-file", files["cert"], "--tls-key-file", files["key"],
           "--tls-ca-cert-file", files["ca"])  # fmt: skip
    primary, primary_tls = start_with_tls_port(
        lambda port: LocalRedis(extra_args=("--tls-port", str(port), *tls))
    )
    conf = tmp_path / "sentinel.conf"
    conf.write_text(
        "sentinel resolve-hostnames no\n"
        f"sentinel monitor ingest 127.0.0.1 {primary_tls} 1\n"
        "sentinel down-after-milliseconds ingest 5000\n"
    )
    sentinel, sentinel_tls = start_with_tls_port(lambda port: LocalRedis(
        directory=tmp_path, config_file=conf,
        extra_args=("--sentinel", "--tls-port", str(port), "--tls-replication", "yes", *tls),
    ))  # fmt: skip
    try:
        url = f"rediss+sentinel://127.0.0.1:{sentinel_tls}/ingest"
        settings = settings_for(
            url, tls_ca_file=files["ca"], tls_cert_file=files["client_cert"],
            tls_key_file=files["client_key"],
        )  # fmt: skip
        assert settings.redis.min_replicas_acked == 1
        settings = Settings.from_mapping({
            "redis": {"url": url, "tls_ca_file": files["ca"], "tls_cert_file": files["client_cert"],
                      "tls_key_file": files["client_key"], "min_replicas_acked": 0},
            "lease": {"ttl_ms": 1500},
        })  # fmt: skip
        await leads_and_commits(settings, job)
    finally:
        sentinel.stop()
        primary.stop()
