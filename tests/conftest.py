"""Shared fixtures: a real redis-server on a free loopback port, and per-test job names."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest
import redis

from actors.lease_store import LeaseStore, connect
from ingestion.local_redis import LocalRedis
from tests.redis_ha import sentinel_group  # noqa: F401  (a fixture)

_jobs = itertools.count(1)


@pytest.fixture(scope="session")
def redis_server() -> Iterator[LocalRedis]:
    server = LocalRedis().start()
    yield server
    server.stop()


@pytest.fixture
def private_redis() -> Iterator[LocalRedis]:
    """A redis-server of the test's own, for tests that stop, pause or restart it."""
    server = LocalRedis().start()
    yield server
    server.stop()


@pytest.fixture
def job(request: pytest.FixtureRequest) -> str:
    return f"{request.node.name[:40]}-{next(_jobs)}"


@pytest.fixture
def redis_client(redis_server: LocalRedis) -> Iterator[redis.Redis]:
    client = connect(redis_server.url, timeout=2.0)
    yield client
    client.close()


def make_store(url: str, job: str, timeout: float = 0.25) -> LeaseStore:
    return LeaseStore(connect(url, timeout=timeout), job)
