"""Shared fixtures: a real redis-server on a free loopback port, and per-test job names.

Under ``CI=true`` no test skips silently: ``scripts/setup`` installs everything the suite needs
(redis-server, a C compiler, libfaketime, the test extras), so a skip there means a test that did
not run, and it is reported as a failure. The one exception is the recorded Horizon data, which lies
outside the repository (:mod:`ingestion.testing.recorded`): those tests may skip, with that reason only, and
the run ends with a line saying how many did not run.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
from collections.abc import Callable, Generator, Iterator
from typing import Any

import pytest
import redis

from actors.lease_store import LeaseStore, connect
from ingestion.testing import recorded
from ingestion.testing.local_postgres import LocalPostgres
from ingestion.testing.local_redis import LocalRedis
from ingestion.testing.pg_replica import StreamingReplica
from ingestion.testing.redis_ha import SentinelGroup
from tests.support.nodes import lease_store

CI = os.environ.get("CI", "").lower() not in ("", "0", "false", "no")

# A run started in the background by a shell (`./scripts/test &`, no job control) inherits SIGINT
# ignored, and so would every process a test starts: a `tail` or a demo told to stop with SIGINT
# would never hear it. Handled here (not ignored), it is reset to the default in every child.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
_recorded_skips: list[str] = []
RECORDED_SKIP = "skipped-for-recorded-data"


def _skip_reason(report: pytest.TestReport | pytest.CollectReport) -> str:
    longrepr = report.longrepr
    return str(longrepr[2]) if isinstance(longrepr, tuple) else str(longrepr)


def _fail_skip_in_ci(report: pytest.TestReport | pytest.CollectReport) -> None:
    if not (CI and report.skipped) or hasattr(report, "wasxfail"):
        return
    reason = _skip_reason(report)
    from_recordings = recorded.SKIP_REASON in reason or report.nodeid in recorded.excused
    if from_recordings and recorded.absence_excused():
        # counted where the reports meet (pytest_runtest_logreport): with xdist, the controller
        if hasattr(report, "user_properties"):
            report.user_properties.append((RECORDED_SKIP, True))
        else:
            _recorded_skips.append(report.nodeid)
        return
    report.outcome = "failed"
    report.longrepr = (
        f"skipped under CI=true ({reason}): scripts/setup installs everything the suite needs, "
        "so in CI a skip is a test that did not run"
    )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    _fail_skip_in_ci(report)
    return report


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(
    collector: pytest.Collector,
) -> Generator[None, pytest.CollectReport, pytest.CollectReport]:
    report = yield  # a module-level skip (importorskip, skip(allow_module_level=True))
    _fail_skip_in_ci(report)
    return report


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if (RECORDED_SKIP, True) in report.user_properties and report.nodeid not in _recorded_skips:
        _recorded_skips.append(report.nodeid)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _recorded_skips:
        terminalreporter.write_line(
            f"{len(_recorded_skips)} tests did not run: they read recorded Horizon responses or lake "
            f"objects, which lie outside the repository and are absent at {recorded.HORIZON.parent} "
            f"(set {recorded.ENV} to where it is)",
            yellow=True,
        )


_jobs = itertools.count(1)


@pytest.fixture(scope="session")
def redis_server() -> Iterator[LocalRedis]:
    server = LocalRedis().start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def pg() -> Iterator[LocalPostgres]:
    """A PostgreSQL server (Debian's, run as the ``postgres`` user when root) for the module's
    tests; each test uses jobs of its own."""
    server = LocalPostgres().start()
    try:
        yield server
    finally:
        server.cleanup()


@pytest.fixture
def replica(pg: LocalPostgres) -> Iterator[StreamingReplica]:
    """A streaming replica of the module's ``pg`` (``pg_basebackup``), the test's own."""
    server = StreamingReplica.start(pg)
    try:
        yield server
    finally:
        server.cleanup()


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


@pytest.fixture
def open_store() -> Iterator[Callable[..., LeaseStore]]:
    """``open_store(url, job, timeout=..., **options)``: a lease store on a client of its own
    (:func:`tests.support.nodes.lease_store`); every one the test opened is closed when it ends."""
    with contextlib.ExitStack() as opened:

        def open_(url: str, job: str, **options: Any) -> LeaseStore:
            return opened.enter_context(lease_store(url, job, **options))

        yield open_


@pytest.fixture
def sentinel_group() -> Iterator[SentinelGroup]:
    group = SentinelGroup().start()
    try:
        yield group
    finally:
        group.stop()
