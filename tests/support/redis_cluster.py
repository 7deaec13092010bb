"""A real Redis Cluster on loopback for the tests: ``masters`` masters, each with ``replicas``
replicas, created with ``redis-cli --cluster create``, node timeout ``node_timeout_ms``.

``kill_master_of(key)`` SIGKILLs the master serving a key's slot; its replica is promoted by the
cluster itself after the node timeout (no Sentinel).
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager

import attrs
import redis
from redis.cluster import RedisCluster

from ingestion.testing.local_redis import LocalRedis, RedisServerMissing, free_port, start_retrying


def cluster_port() -> int:
    """A loopback port whose cluster-bus port (port + 10000) was free too a moment ago (the node
    is started with :func:`start_retrying`: either may be taken before it binds them)."""
    for _ in range(100):  # most picks fit: ports above 55535 have no bus port
        port = free_port()
        if port + 10000 > 65535:
            continue
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        return port
    raise RuntimeError("no loopback port with a free cluster-bus port in 100 picks")


@attrs.define
class RedisClusterGroup:
    masters: int = 3
    replicas: int = 0
    node_timeout_ms: int = 1000
    servers: list[LocalRedis] = attrs.Factory(list)

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"127.0.0.1:{s.port}" for s in self.servers[:3])

    def start(self, timeout: float = 30.0) -> RedisClusterGroup:
        cli = shutil.which("redis-cli")
        if cli is None:
            raise RedisServerMissing("redis-cli is not installed (Debian: apt-get install -y redis-tools)")
        for _ in range(self.masters * (1 + self.replicas)):
            self.servers.append(start_retrying(self._node))
        done = subprocess.run(
            [cli, "--cluster", "create", *(f"127.0.0.1:{s.port}" for s in self.servers),
             "--cluster-replicas", str(self.replicas), "--cluster-yes"],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        if done.returncode != 0:
            self.stop()
            raise RuntimeError(
                f"redis-cli --cluster create failed: {done.stdout[-2000:]} {done.stderr[-2000:]}"
            )
        self.wait_ok(timeout)
        return self

    def _node(self) -> LocalRedis:
        server = LocalRedis(port=cluster_port())
        server.extra_args = (
            "--cluster-enabled", "yes",
            "--cluster-config-file", str(server.directory / "nodes.conf"),
            "--cluster-node-timeout", str(self.node_timeout_ms),
            # a replica that lost its master long ago may still be promoted (tests kill masters)
            "--cluster-replica-validity-factor", "0",
        )  # fmt: skip
        return server

    def wait_ok(self, timeout: float = 30.0) -> None:
        """Until every running node says cluster_state:ok and every slot is served."""
        end = time.monotonic() + timeout
        while True:
            states = []
            for s in self.servers:
                if s.process is None:
                    continue
                try:
                    client = self._client(s)
                    info = client.cluster("info")
                    ok = info.get("cluster_state") == "ok" and int(info.get("cluster_slots_ok", 0)) == 16384
                    replication = client.info("replication")
                    if replication.get("role") == "slave":
                        ok = ok and replication.get("master_link_status") == "up"
                    states.append(ok)
                except redis.RedisError:
                    states.append(False)
            if states and all(states):
                return
            if time.monotonic() > end:
                raise RuntimeError(f"cluster not ok after {timeout}s: {states}")
            time.sleep(0.1)

    @staticmethod
    def _client(server: LocalRedis) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=server.port, decode_responses=True, socket_timeout=1)

    def client(self) -> RedisCluster:
        return RedisCluster(host="127.0.0.1", port=self.servers[0].port, decode_responses=True)

    def server_for(self, key: str) -> LocalRedis:
        """The server that is master of ``key``'s slot now."""
        slot = int(self._client(self.servers[0]).cluster("keyslot", key))
        for s in self.servers:
            if s.process is None:
                continue
            try:
                node_id = self._client(s).cluster("myid")
                for start, end, master, *_ in self._slots(s):
                    if start <= slot <= end and master[2] == node_id:
                        return s
            except redis.RedisError:
                continue
        raise LookupError(f"no live master serves slot {slot}")

    def _slots(self, s: LocalRedis) -> list[list[object]]:
        raw: list[list[object]] = self._client(s).execute_command("CLUSTER", "SLOTS")
        out = []
        for entry in raw:
            start, end, master = entry[0], entry[1], entry[2]
            out.append([int(start), int(end), list(master)])  # type: ignore[call-overload]
        return out

    def kill_master_of(self, key: str) -> LocalRedis:
        server = self.server_for(key)
        server.kill()
        return server

    def stop(self) -> None:
        for s in self.servers:
            s.kill()


@contextmanager
def redis_cluster(
    masters: int = 3, replicas: int = 0, node_timeout_ms: int = 1000
) -> Iterator[RedisClusterGroup]:
    group = RedisClusterGroup(masters, replicas, node_timeout_ms).start()
    try:
        yield group
    finally:
        group.stop()
