"""An ``s3://`` lake: a simulator-written lake uploaded to a loopback S3-compatible server (moto's
``ThreadedMotoServer`` on 127.0.0.1), read anonymously (no AWS credentials in the environment)
through ``lake.endpoint_url``, gives the events the same lake gives from its directory."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from ingestion.lake.source import LakeSource
from ingestion.lake.store import S3Lake, check_lake_url, open_lake
from ingestion.rpc.protocol import Cursor
from ingestion.simulator import SimulatorConfig, open_simulator
from tests.support.lakes import ids_until
from tests.support.ports import closed_port


@pytest.fixture
def s3(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[str]:
    """A loopback S3 endpoint; the AWS credential chain finds nothing (anonymous reads)."""
    from moto.server import ThreadedMotoServer

    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


def _upload(endpoint: str, root: Path, bucket: str, prefix: str) -> None:
    import boto3

    client = boto3.client(
        "s3", endpoint_url=endpoint, region_name="us-east-1",
        aws_access_key_id="test", aws_secret_access_key="test",
    )  # fmt: skip
    client.create_bucket(Bucket=bucket, ACL="public-read")  # as Stellar's public lakes are
    for path in root.rglob("*"):
        if path.is_file():
            key = prefix + path.relative_to(root).as_posix()
            client.put_object(Bucket=bucket, Key=key, Body=path.read_bytes(), ACL="public-read")


def test_s3_lake_urls() -> None:
    assert check_lake_url("s3://bucket/some/prefix") is None
    assert "names a bucket" in (check_lake_url("s3:///prefix") or "")
    lake = open_lake("s3://bucket/some/prefix/", "http://127.0.0.1:9")
    assert lake == S3Lake("bucket", "some/prefix/", "http://127.0.0.1:9")
    assert open_lake("s3://bucket") == S3Lake("bucket", "", None)


async def test_an_s3_lake_read_anonymously_gives_the_directorys_events(s3: str, tmp_path: Path) -> None:
    config = SimulatorConfig(
        history_ledgers=40, ledger_interval=None, rpc_port=0, lake_dir=str(tmp_path / "lake")
    )
    async with open_simulator(config) as sim:
        with trio.fail_after(20):
            await sim.wait_for_lake(sim.chain.latest)
        latest = sim.chain.latest
    await trio.to_thread.run_sync(_upload, s3, tmp_path / "lake", "lakes", "sim/net/")
    remote = LakeSource("s3://lakes/sim/net", endpoint_url=s3, decode_processes=0)
    assert await remote.probe()
    assert await remote.lake.edges() == (config.first_ledger, latest)
    assert await remote.resolve_start("now") == str(Cursor.through(latest))
    local = LakeSource(str(tmp_path / "lake"), decode_processes=0)
    with trio.fail_after(30):
        ids = await ids_until(remote, latest)
        assert ids == await ids_until(local, latest) and ids
    assert not await LakeSource("s3://lakes/elsewhere", endpoint_url=s3).probe()
    unreachable = LakeSource("s3://lakes/sim/net", endpoint_url=f"http://127.0.0.1:{closed_port()}")
    assert not await unreachable.probe()
