"""``LocalRedis.start`` against port clashes: whoever answers on the port must be its own child
(``INFO server`` ``process_id``); a port it picked is picked again, an explicit or handed-out one
fails loudly."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest
import redis

from ingestion.testing import local_redis
from ingestion.testing.local_redis import LocalRedis, PortInUse, start_retrying


@pytest.fixture
def squatter() -> Iterator[int]:
    """A port someone else listens on (and never answers)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield int(s.getsockname()[1])


def answering_pid(server: LocalRedis) -> int:
    client = redis.Redis(host="127.0.0.1", port=server.port)
    try:
        return int(client.info("server")["process_id"])
    finally:
        client.close()


def picks(monkeypatch: pytest.MonkeyPatch, *first: int) -> None:
    """``free_port`` hands out ``first`` (taken ports) before really free ones."""
    queue, real = list(first), local_redis.free_port
    monkeypatch.setattr(local_redis, "free_port", lambda: queue.pop(0) if queue else real())


def test_a_picked_port_someone_listens_on_is_picked_again(
    monkeypatch: pytest.MonkeyPatch, squatter: int
) -> None:
    picks(monkeypatch, squatter, squatter)
    server = LocalRedis().start()
    try:
        assert server.port != squatter
        assert server.process is not None and answering_pid(server) == server.process.pid
    finally:
        server.stop()


def test_a_picked_port_another_redis_answers_on_is_picked_again(
    monkeypatch: pytest.MonkeyPatch, redis_server: LocalRedis
) -> None:
    picks(monkeypatch, redis_server.port)
    server = LocalRedis().start()
    try:
        assert server.port != redis_server.port
        assert server.process is not None and answering_pid(server) == server.process.pid
    finally:
        server.stop()


def test_an_explicit_port_that_is_taken_fails_loudly(redis_server: LocalRedis, squatter: int) -> None:
    with pytest.raises(PortInUse, match="another redis-server"):
        LocalRedis(port=redis_server.port).start()
    with pytest.raises(PortInUse, match="in use"):
        LocalRedis(port=squatter).start()


def test_a_restart_comes_back_on_its_port_or_fails_loudly() -> None:
    server = LocalRedis().start()
    port = server.port
    server.kill()
    try:
        assert server.start().port == port
        server.kill()
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))
            s.listen()
            with pytest.raises(PortInUse):
                server.start()
        assert server.process is None
    finally:
        server.stop()


def test_picked_ports_that_stay_taken_give_up_after_the_attempts(
    monkeypatch: pytest.MonkeyPatch, squatter: int
) -> None:
    monkeypatch.setattr(local_redis, "free_port", lambda: squatter)
    with pytest.raises(PortInUse):
        LocalRedis().start(attempts=3)


def test_start_retrying_builds_again_when_an_extra_port_is_taken(
    monkeypatch: pytest.MonkeyPatch, squatter: int
) -> None:
    picks(monkeypatch, squatter)
    bus_ports: list[int] = []

    def build() -> LocalRedis:  # a second port (the cluster bus here; a TLS port is the same)
        bus_ports.append(local_redis.free_port())
        return LocalRedis(
            port=local_redis.free_port(),
            extra_args=("--cluster-enabled", "yes", "--cluster-port", str(bus_ports[-1])),
        )

    server = start_retrying(build)
    try:
        assert bus_ports[0] == squatter and len(bus_ports) == 2
        assert server.process is not None and answering_pid(server) == server.process.pid
    finally:
        server.stop()
