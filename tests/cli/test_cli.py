"""The command line as an operator meets it: real processes, their exit status and stderr.

Each mistake gets one line on stderr naming the setting and exit 2, never a traceback, and a node
that cannot start says so before it campaigns.
"""

from __future__ import annotations

import functools
import json
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from actors.lease_store import connect, job_keys
from ingestion import __version__
from ingestion.cli import COMMANDS
from ingestion.cli.run import parser as _run_parser
from ingestion.testing.local_redis import LocalRedis
from tests.support.cli import env, one_line, run
from tests.support.ports import closed_port

INGESTION = Path(sys.executable).parent / "ingestion"


@pytest.fixture
def listening() -> Iterator[int]:
    """A loopback port another process (this one) already listens on."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    yield int(s.getsockname()[1])
    s.close()


def test_the_installed_command_lists_every_subcommand_and_prints_the_version() -> None:
    done = subprocess.run([str(INGESTION), "--help"], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0
    for name in ("run", "simulate", "inspect", "tail", "watch", "demo", "verify", "check-config"):
        assert any(line.split()[:1] == [name] for line in done.stdout.splitlines()), name
    assert set(COMMANDS) >= {"verify", "check-config"}
    for argv in (["--version"], ["version"]):
        done = subprocess.run([str(INGESTION), *argv], capture_output=True, text=True, timeout=30)
        assert (done.returncode, done.stdout.strip()) == (0, f"ingestion {__version__}")


def test_every_run_flag_shows_its_default_and_environment_variable() -> None:
    for action in _run_parser()._actions:
        if action.dest in ("help", "config"):
            continue
        assert "default: " in (action.help or "") and "env INGESTION_" in (action.help or ""), action.dest
    done = subprocess.run([str(INGESTION), "run", "--help"], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0 and "INGESTION_REDIS_URL" in done.stdout and "--metrics-port" in done.stdout


def test_an_unknown_flag_or_command_is_one_line() -> None:
    assert one_line(run("--no-such-flag")).startswith("ingestion: run: unrecognized arguments")
    assert one_line(run("inspekt")).startswith("ingestion: unknown command 'inspekt'")


@pytest.mark.parametrize("command", ["watch", "demo", "simulate"])
def test_a_bad_flag_of_watch_demo_or_simulate_is_one_line(command: str) -> None:
    extra = ["ws://127.0.0.1:1"] if command == "watch" else []
    line = one_line(run(command, *extra, "--x"))
    assert line == f"ingestion: {command}: unrecognized arguments: --x (see ingestion {command} --help)"
    assert one_line(run(command, "--duration" if command != "simulate" else "--port", "soon"))


@pytest.mark.parametrize("flag", ["--metrics-port", "--status-port"])
def test_a_busy_listen_port_is_one_line_before_campaigning(
    redis_server: LocalRedis, job: str, listening: int, flag: str
) -> None:
    done = run("--redis", redis_server.url, "--job", job, flag, str(listening), "--log-format", "json")
    setting = "observe.metrics_port" if flag == "--metrics-port" else "observe.status_port"
    line = one_line(done)
    assert line.startswith(f"ingestion: configuration error: {setting}: port {listening}")
    assert "already in use" in line
    assert "became-leader" not in done.stdout and "standby" not in done.stdout


def test_a_bad_listen_host_is_one_line_naming_the_setting(redis_server: LocalRedis, job: str) -> None:
    done = run(
        "--redis", redis_server.url, "--job", job, "--metrics-port", "0", "--status-port", "1",
        "--log-format", "json", extra_env={"INGESTION_OBSERVE_LISTEN_HOST": "no-such-host.invalid"},
    )  # fmt: skip
    assert one_line(done).startswith("ingestion: configuration error: observe.listen_host: ")
    assert "became-leader" not in done.stdout


def test_the_simulator_on_a_busy_port_is_one_line(listening: int) -> None:
    line = one_line(run("simulate", "--port", str(listening)))
    assert line.startswith(f"ingestion: simulate: --port {listening}: already in use")


def before_our_first_line(err: str) -> bool:
    """Whether a SIGINT landed while Python itself was starting, before ``python -m ingestion``
    ran a line of ours: the interpreter's site module (the installed packages' .pth hooks) or
    runpy finding the package. Python prints that KeyboardInterrupt itself, and no program can
    change it; seen in CI under load at 0.05 s, in both places."""
    lines = err.strip().splitlines()
    if not lines or not lines[-1].rstrip(")").strip().endswith("KeyboardInterrupt"):
        return False
    frames = [line for line in lines if line.strip().startswith("File ")]
    ours = [f for f in frames if "/ingestion/" in f or "/actors/" in f]
    return bool(frames) and not ours


def test_a_keyboard_interrupt_in_our_code_is_not_taken_for_pythons_own_start_up() -> None:
    head = "Traceback (most recent call last):\n"
    runpy = head + '  File "<frozen runpy>", line 112, in _get_module_details\nKeyboardInterrupt\n'
    assert before_our_first_line(runpy)
    ours = head + '  File "/x/ingestion/node/worker.py", line 5, in run\nKeyboardInterrupt\n'
    assert not before_our_first_line(ours)
    assert not before_our_first_line("")


@pytest.mark.parametrize("delay", [0.05, 0.1, 0.2, 0.4])
def test_ctrl_c_during_start_up_exits_without_a_traceback(
    redis_server: LocalRedis, job: str, delay: float
) -> None:
    child = subprocess.Popen(
        [sys.executable, "-m", "ingestion", "--redis", redis_server.url, "--job", job,
         "--log-format", "json"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env(),
    )  # fmt: skip
    time.sleep(delay)
    child.send_signal(signal.SIGINT)
    try:
        _out, err = child.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        # Seen once in CI (at 0.05 s, not reproduced since): say where the signal went. SigPnd/
        # SigBlk: held and never taken; SigIgn: ignored; SigCgt: a handler that did not act.
        status = Path(f"/proc/{child.pid}/status").read_text()
        wanted = ("State", "Threads", "Sig", "ShdPnd")
        masks = [line for line in status.splitlines() if line.startswith(wanted)]
        tree = subprocess.run(["ps", "-o", "pid,ppid,stat,args", "--ppid", str(child.pid)],
                              capture_output=True, text=True).stdout  # fmt: skip
        child.kill()
        _out, err = child.communicate(timeout=10)
        raise AssertionError(
            f"no exit 30 s after SIGINT: {masks}\nchildren:\n{tree}\nstderr:\n{err}"
        ) from None
    if before_our_first_line(err):
        return
    assert "Traceback" not in err and not err.strip(), err
    # 130 while it starts; 0 once the node runs (its graceful shutdown). A signal that arrives
    # before the interpreter has installed any handler (a loaded machine can start Python later
    # than `delay`) ends the process by SIGINT's default action, which a shell reports as 130 too.
    assert child.returncode in (0, 130, -signal.SIGINT)


def node_against(silent: socket.socket) -> subprocess.Popen[str]:
    """A node process whose Redis is ``silent`` (a socket that accepts and never answers)."""
    return subprocess.Popen(
        [sys.executable, "-m", "ingestion", "--redis", f"redis://127.0.0.1:{silent.getsockname()[1]}/0",
         "--job", "held", "--log-format", "json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env(),
    )  # fmt: skip


def test_a_stop_signal_while_start_up_waits_on_redis_ends_start_up_before_the_node() -> None:
    """SIGINT and SIGTERM are held from the first line of ``python -m ingestion`` until something
    receives them on purpose (ingestion/node/stop_signals.py): one that came while Python ran other
    code could be raised inside a finalizer ("Exception ignored in ConnectionPool.__del__"),
    dropped, and the node started and ran on. A SIGTERM while the start-up check waits on a
    Redis that accepts and never answers ends start-up after that step: 143, no node."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)  # connections complete in the backlog; nothing ever answers
        child = node_against(silent)
        silent.settimeout(30)
        waiting, _ = silent.accept()  # the start-up check has connected: it now waits (2 s)
        with waiting:
            child.send_signal(signal.SIGTERM)
            out, err = child.communicate(timeout=30)
    assert child.returncode == 128 + signal.SIGTERM, (child.returncode, err)
    assert not err.strip(), err
    assert "node-starting" not in out


STOP_BOUND = 2.0  # seconds from a stop signal during start-up to the exit (docs/OPERATIONS.md)


@pytest.mark.parametrize("after_connect", [0.0, 0.7, 1.5])
def test_a_stop_signal_during_the_start_up_checks_exits_within_the_documented_bound(
    after_connect: float,
) -> None:
    """Each start-up question to a Redis that accepts and never answers waits 2 s, and there are
    several: a SIGTERM during them used to end start-up only when they had all timed out (3-4 s).
    The checks now run in a thread while the signal is waited for: exit 143 well within 2 s."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        child = node_against(silent)
        silent.settimeout(30)
        waiting, _ = silent.accept()  # the start-up check has connected: it now waits
        with waiting:
            time.sleep(after_connect)
            sent = time.monotonic()
            child.send_signal(signal.SIGTERM)
            out, err = child.communicate(timeout=30)
            took = time.monotonic() - sent
    print(f"\nSIGTERM {after_connect} s into the Redis checks: exit after {took * 1000:.0f} ms")
    assert child.returncode == 128 + signal.SIGTERM, (child.returncode, err)
    assert not err.strip(), err
    assert "node-starting" not in out
    assert took < STOP_BOUND, f"exit {took:.2f} s after SIGTERM"


def test_a_stop_signal_right_after_spawn_exits_within_the_documented_bound() -> None:
    """Against a Redis that never answers, SIGTERM at once: the process ends within 2 s (before
    Python ran our first line it ends by the signal's default action)."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        child = node_against(silent)
        time.sleep(0.05)
        sent = time.monotonic()
        child.send_signal(signal.SIGTERM)
        _out, err = child.communicate(timeout=30)
        took = time.monotonic() - sent
    print(f"\nSIGTERM right after spawn: exit after {took * 1000:.0f} ms")
    assert child.returncode in (128 + signal.SIGTERM, -signal.SIGTERM), (child.returncode, err)
    assert "Traceback" not in err, err
    assert took < STOP_BOUND, f"exit {took:.2f} s after SIGTERM"


def test_a_database_that_is_not_a_number_is_exit_2() -> None:
    line = one_line(run("check-config", "--redis", "redis://127.0.0.1:6390/abc"))
    assert line == (
        "ingestion: configuration error: redis.url: the database must be a number such as /0, "
        "got 'abc' in 'redis://127.0.0.1:6390/abc'"
    )


@pytest.mark.parametrize("port", ["99999", "abc"])
@pytest.mark.parametrize("command", ["check-config", "run", "inspect"])
def test_a_redis_port_out_of_range_or_not_a_number_is_one_line_before_any_connection(
    command: str, port: str
) -> None:
    line = one_line(run(command, "--redis", f"redis://127.0.0.1:{port}/0", "--job", "j"))
    assert line == (
        "ingestion: configuration error: redis.url: the port must be a number from 1 to 65535, "
        f"got '{port}' in 'redis://127.0.0.1:{port}/0'"
    )


def test_a_flag_is_never_taken_for_a_longer_one() -> None:
    # --lease-ttl is not --lease-ttl-ms (argparse would take the abbreviation): a unit is part of
    # the name, and a value in seconds taken as milliseconds is no small mistake.
    line = one_line(run("run", "--lease-ttl", "5", "--job", "j"))
    assert "unrecognized arguments: --lease-ttl 5" in line, line


def test_the_test_suite_s_and_the_projector_s_variables_are_not_taken_for_settings() -> None:
    from ingestion.config.layers import NOT_SETTINGS
    from ingestion.testing.recorded import ENV

    assert ENV in NOT_SETTINGS
    done = run("check-config", "--job", "j", extra_env={
        ENV: "/nowhere", "INGESTION_PROJECTOR_JOB": "totals", "INGESTION_PROJECTOR_SOURCE": "h",
    })  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert one_line(run("check-config", extra_env={"INGESTION_LEASE_TTL": "1"})).endswith(
        "INGESTION_LEASE_TTL: unknown setting (did you mean 'lease_ttl_ms'?)"
    )


def test_a_database_beyond_the_servers_databases_is_exit_2(redis_server: LocalRedis, job: str) -> None:
    url = redis_server.url.rsplit("/", 1)[0] + "/99"
    line = one_line(run("--redis", url, "--job", job), 2)
    assert line.startswith(f"ingestion: configuration error: redis.url {url}: database 99 does not exist")


def test_a_sentinel_url_pointed_at_a_plain_redis_is_exit_2(redis_server: LocalRedis, job: str) -> None:
    address = redis_server.url.split("//")[1].split("/")[0]
    line = one_line(run("--redis", f"redis+sentinel://{address}/mymaster", "--job", job))
    assert line.startswith("ingestion: configuration error: redis.url")
    assert f"{address} is not a sentinel" in line


def test_a_cluster_url_pointed_at_a_plain_redis_is_exit_2(redis_server: LocalRedis, job: str) -> None:
    address = redis_server.url.split("//")[1].split("/")[0]
    line = one_line(run("--redis", f"redis+cluster://{address}", "--job", job))
    assert line.startswith(f"ingestion: configuration error: redis.url redis+cluster://{address}: ")
    assert f"{address} is not a Redis Cluster node" in line and "cluster support disabled" in line
    assert "use redis://HOST:PORT/DB for a plain Redis" in line


@pytest.mark.parametrize(
    ("server_args", "path", "says"),
    [
        (("--requirepass", "secret"), "/0", "authentication failed"),
        (("--databases", "4"), "/9", "database 9 does not exist on this server (it has 4 databases)"),
    ],
)
def test_a_redis_down_at_start_that_comes_up_wrong_is_exit_2_not_retried_forever(
    job: str, server_args: tuple[str, ...], path: str, says: str
) -> None:
    server = LocalRedis(extra_args=server_args, password="secret" if "--requirepass" in server_args else None)
    url = f"redis://127.0.0.1:{server.port}{path}"
    child = subprocess.Popen(
        [sys.executable, "-m", "ingestion", "--redis", url, "--job", job, "--log-format", "json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env(),
    )  # fmt: skip
    try:
        time.sleep(3)
        assert child.poll() is None  # an outage: waited out
        server.start()
        _out, err = child.communicate(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate()
        server.stop()
    done = subprocess.CompletedProcess(child.args, child.returncode, _out, err)
    line = one_line(done)
    assert line.startswith(f"ingestion: configuration error: redis.url {url}: {says}"), line


def test_a_redis_url_pointed_at_an_http_server_is_exit_2() -> None:
    sim = subprocess.Popen(
        [sys.executable, "-m", "ingestion", "simulate", "--port", "0", "--ledger-interval", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env(),
    )  # fmt: skip
    try:
        assert sim.stdout is not None
        url = json.loads(sim.stdout.readline())["url"]
        port = url.rsplit(":", 1)[1]
        line = one_line(run("--redis", f"redis://127.0.0.1:{port}/0", "--job", "j"))
        assert "an HTTP server answers at" in line and "redis.url" in line
    finally:
        sim.terminate()
        sim.wait(timeout=10)


def test_refused_credentials_and_acl_are_exit_2(redis_server: LocalRedis, job: str) -> None:
    admin = connect(redis_server.url, timeout=2.0)
    user = f"u-{job}"
    admin.acl_setuser(user, enabled=True, passwords=["+secret"], keys=["other:*"], commands=["+@all"])
    try:
        address = redis_server.url.split("//")[1]
        line = one_line(run("--redis", f"redis://{user}:wrong@{address}", "--job", job))
        assert "authentication failed" in line and "wrong" not in line
        line = one_line(run("--redis", f"redis://{user}:secret@{address}", "--job", job))
        assert "permission denied by the Redis ACL" in line
    finally:
        admin.acl_deluser(user)
        admin.close()


def test_an_unreachable_redis_is_still_retried_not_refused(job: str) -> None:
    child = subprocess.Popen(
        [sys.executable, "-m", "ingestion", "--redis", f"redis://127.0.0.1:{closed_port()}/0",
         "--job", job, "--log-format", "json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env(),
    )  # fmt: skip
    try:
        time.sleep(3)
        assert child.poll() is None  # still waiting for Redis
    finally:
        child.send_signal(signal.SIGTERM)
        child.communicate(timeout=30)


def test_the_default_job_is_named_after_the_source() -> None:
    done = run("check-config", "--source", "rpc", "--json")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["jobs"] == [{"job": "rpc", "kind": "rpc", "follows": "rpc (every event)", "watch": None}]
    assert doc["settings"]["node.source"] == {"value": "rpc", "source": "flag"}
    assert doc["settings"]["node.job"]["value"] == ["rpc"]


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--source", "rpc", "--resource", "/payments"], "ingestion: --resource: only for a Horizon job"),
        (["--topic", "sym:transfer"], "ingestion: --topic: only for an RPC job"),
        (["--event-type", "contract"], "ingestion: --event-type: only for an RPC job"),
        (["--source", "rpc", "--horizon", "http://h:8000"], "ingestion: --horizon: only for a Horizon job"),
        (["--rpc", "http://r:8000"], "ingestion: --rpc: only for an RPC job"),
        (["--source", "lake", "--lake", "/tmp", "--rpc", "http://r:8000"], "ingestion: --rpc: only for"),
        (["--job", "a", "--job", "b=/payments", "--rpc", "http://r:8000"], "ingestion: --rpc: only for"),
    ],
)
def test_a_flag_for_the_other_source_is_exit_2(argv: list[str], says: str) -> None:
    assert one_line(run(*argv, "--redis", f"redis://127.0.0.1:{closed_port()}/0")).startswith(says)


def test_check_config_says_where_each_jobs_watch_list_comes_from(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    listing = tmp_path / "accounts.txt"
    config.write_text(
        '[jobs.a]\nkind = "rpc"\nwatch_set = true\n'
        f'[jobs.b]\nkind = "rpc"\nwatch_file = "{listing}"\n'
        '[jobs.c]\nkind = "rpc"\nwatch = ["GC5LF63GRVIT5ZXXCXLPI3RX2YXKJQFZVBSAO6AUELN3YIMSWPD6Z6FH"]\n'
        '[jobs.d]\nkind = "rpc"\n'
    )
    listing.write_text("GAFK7XFZHMLSNV7OJTBO7BAIZA66X6QIBV5RMZZYXK4Q7ZSO52J5C3WQ\n")
    done = run("check-config", "--config", str(config))
    assert done.returncode == 0, done.stderr
    lines = {line.split(":", 1)[0]: line for line in done.stdout.splitlines() if line.startswith("job ")}
    assert lines["job a"].endswith("naming an address of the Redis set ingestion:{a}:watch (edited with "
                                   "ingestion watchlist)"), lines  # fmt: skip
    assert f"of the watch file {listing}" in lines["job b"]
    assert lines["job c"].endswith("of its watch setting (1 address)")
    assert "watch" not in lines["job d"]
    doc = json.loads(run("check-config", "--config", str(config), "--json").stdout)
    assert [j["watch"] is None for j in doc["jobs"]] == [False, False, False, True]


def test_a_node_hosting_both_kinds_takes_both_sources_flags(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text('[jobs.h]\nkind = "horizon"\n[jobs.r]\nkind = "rpc"\n')
    flags = ["--horizon", "http://h:8000", "--rpc", "http://r:8000", "--topic", "sym:transfer"]
    done = run("check-config", "--config", str(config), *flags, "--resource", "/payments", "--json")
    assert done.returncode == 0, done.stderr
    assert [j["kind"] for j in json.loads(done.stdout)["jobs"]] == ["horizon", "rpc"]
    # ... but not a URL flag that every job of its kind overrides in its table.
    config.write_text('[jobs.h]\nkind = "horizon"\nhorizon = ["http://own:8000"]\n[jobs.r]\nkind = "rpc"\n')
    line = one_line(run("check-config", "--config", str(config), *flags))
    assert line.startswith("ingestion: --horizon: every horizon job here names its own URLs")


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"source": "horizon /operations", "cursor": "12884905985"}, "follows horizon /operations"),
        ({"cursor": "12884905985"}, "follows horizon (its cursor 12884905985 is a Horizon paging token)"),
    ],
)
def test_a_node_configured_for_another_source_refuses_the_job(
    redis_server: LocalRedis, job: str, fields: dict[str, str], says: str
) -> None:
    client: redis.Redis = connect(redis_server.url, timeout=2.0)
    client.hset(job_keys(job)["cursor"], mapping=fields)
    client.close()
    done = run("--redis", redis_server.url, "--job", job, "--source", "rpc", "--rpc",
               f"http://127.0.0.1:{closed_port()}", "--log-format", "json")  # fmt: skip
    line = one_line(done)
    assert line.startswith(f"ingestion: configuration error: node.job: job {job!r} in Redis {says}")
    assert "this node is configured for rpc (every event)" in line
    assert "became-leader" not in done.stdout


def test_check_config_names_where_each_setting_came_from(tmp_path: Path) -> None:
    # redis.timeout_ms = 0 in the file asks for the derived value: "auto", not "file"
    (tmp_path / "c.toml").write_text("[lease]\nttl_ms = 6000\n\n[redis]\ntimeout_ms = 0\n")
    done = subprocess.run(
        [sys.executable, "-m", "ingestion", "check-config", "--config", str(tmp_path / "c.toml"),
         "--redis", "redis://:pw@127.0.0.1:1/3", "--json"],
        capture_output=True, text=True, timeout=30, env={**env(), "INGESTION_LOG_LEVEL": "debug"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)["settings"]
    assert got["lease.ttl_ms"] == {"value": 6000, "source": "file"}
    assert got["log.level"] == {"value": "debug", "source": "env"}
    assert got["redis.url"] == {"value": "redis://:***@127.0.0.1:1/3", "source": "flag"}
    assert got["lease.renew_interval_ms"] == {"value": 1200, "source": "auto"}
    assert got["redis.timeout_ms"] == {"value": 500, "source": "auto"}
    assert got["events.max_len"] == {"value": 0, "source": "default"}
    assert "pw" not in done.stdout
    line = one_line(run("check-config", "--lease-ttl-ms", "5"))
    assert line.startswith("ingestion: configuration error: lease.ttl_ms: ")


def test_verify_an_unknown_job_is_exit_2(redis_server: LocalRedis, job: str) -> None:
    line = one_line(run("verify", "--redis", redis_server.url, "--job", job))
    assert line.startswith(f"ingestion: verify: no job {job!r} at ")


async def node_until(client: redis.Redis, job: str, args: list[str], records: int, within: float) -> None:
    """Run a node process with ``args`` until ``job``'s stream holds ``records``, then SIGTERM it."""
    import trio

    async with trio.open_nursery() as nursery:
        node = await nursery.start(functools.partial(
            trio.run_process, [sys.executable, "-m", "ingestion", *args], env=env(),
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False,
        ))  # fmt: skip
        with trio.fail_after(within):
            while client.xlen(job_keys(job)["events"]) < records:  # noqa: ASYNC110 (another process)
                await trio.sleep(0.1)
        node.send_signal(signal.SIGTERM)


async def test_the_first_term_records_the_source_and_verify_checks_the_stream(
    redis_server: LocalRedis, job: str
) -> None:
    """A Horizon node's first term writes ``source`` into the cursor hash; ``ingestion verify``
    then finds the stream exactly once (exit 0), and a forged entry makes it exit 1."""
    import trio

    from ingestion.simulator.server import SimulatorConfig, open_simulator

    config = SimulatorConfig(ledger_interval=None, history_ledgers=5, ops_per_ledger=3)
    client: redis.Redis = connect(redis_server.url, timeout=2.0)
    key = job_keys(job)["cursor"]
    async with open_simulator(config) as sim:
        args = ["--redis", redis_server.url, "--job", job, "--horizon", sim.url, "--start-cursor", "0",
                "--lease-ttl-ms", "1000", "--log-format", "json"]  # fmt: skip
        await node_until(client, job, args, 15, within=20)
        assert client.hget(key, "source") == "horizon /operations"
        verify = ["verify", "--redis", redis_server.url, "--job", job, "--horizon", sim.url,
                  "--start-cursor", "0"]  # fmt: skip
        done = await trio.to_thread.run_sync(functools.partial(run, *verify))
        assert done.returncode == 0, done.stdout + done.stderr
        assert "exactly once, in order: OK" in done.stdout
        first = client.xrange(job_keys(job)["events"], count=1)[0][1]
        client.xadd(job_keys(job)["events"], first)  # a duplicate, as a broken writer would
        done = await trio.to_thread.run_sync(functools.partial(run, *verify))
        assert done.returncode == 1 and "FAILED" in done.stdout, done.stdout + done.stderr
    client.close()


async def test_verify_an_rpc_job_run_from_flags_needs_only_the_rpc_url(
    redis_server: LocalRedis, job: str
) -> None:
    """A job run with ``--source rpc`` and a topic filter on the command line: its first term
    records ``rpc [filters]`` in Redis, so ``verify --job J --rpc URL`` checks it as the RPC job it
    is, with its filters, without the source flags again (it took it for a Horizon job before)."""
    import trio

    from ingestion.simulator.server import SimulatorConfig, open_simulator

    config = SimulatorConfig(ledger_interval=None, history_ledgers=300, ops_per_ledger=20, rpc_port=0)
    client: redis.Redis = connect(redis_server.url, timeout=2.0)
    async with open_simulator(config) as sim:
        args = ["--redis", redis_server.url, "--job", job, "--source", "rpc", "--rpc", sim.rpc_url,
                "--topic", "sym:transfer,*,**", "--start-cursor", "0", "--lease-ttl-ms", "1000",
                "--log-format", "json"]  # fmt: skip
        await node_until(client, job, args, 5, within=30)
        assert str(client.hget(job_keys(job)["cursor"], "source")).startswith("rpc [")
        verify = ["verify", "--redis", redis_server.url, "--job", job, "--rpc", sim.rpc_url]
        done = await trio.to_thread.run_sync(functools.partial(run, *verify))
        assert done.returncode == 0, done.stdout + done.stderr
        assert f"job {job} (rpc, {sim.rpc_url})" in done.stdout
        assert "exactly once, in order: OK" in done.stdout
    client.close()


def test_a_reader_that_goes_away_is_not_a_traceback(tmp_path: Path) -> None:
    """``ingestion check-config | head``: the pipe's reader gone before the command has printed
    is exit 141 (as for SIGPIPE) and no traceback, not a BrokenPipeError."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "ingestion", "check-config"], cwd=tmp_path, env=env(),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # before the command has started: its first write finds no reader
    err = proc.stderr.read().decode()
    assert proc.wait(30) == 141 and "Traceback" not in err, err


def test_a_backfill_whose_rpc_is_unreachable_blames_the_rpc_not_redis(
    redis_server: LocalRedis, tmp_path: Path
) -> None:
    config = tmp_path / "config.toml"
    config.write_text(f'[jobs.ev]\nkind = "rpc"\nrpc = ["http://127.0.0.1:{closed_port()}"]\n')
    done = run("backfill", "ev", "--config", str(config), "--redis", redis_server.url, "--from", "100",
               "--to", "200")  # fmt: skip
    line = one_line(done) if done.returncode == 2 else done.stderr.strip().splitlines()[-1]
    assert done.returncode in (1, 2) and "Traceback" not in done.stderr, done.stderr
    assert "Redis:" not in line and "RPC" in line, line


@pytest.mark.parametrize(
    ("command", "action"),
    [
        ("webhooks", ["replay", "J", "--from", "1"]),
        ("webhooks", ["status"]),
        ("watchlist", ["add", "J", "G1"]),
    ],
)
def test_a_commands_flags_are_taken_after_its_action_too(command: str, action: list[str]) -> None:
    """``ingestion webhooks replay JOB --config F`` as kubectl takes it: a command's flags after its
    action as well as before (every command with actions: the parser shares them); one given
    before the action only is not overwritten by the action's default."""
    from ingestion.cli import parser_of

    parser = parser_of(command)
    assert parser is not None
    after = parser.parse_args([*action, "--config", "f.toml", "--redis", "redis://after"])
    assert (after.config, after.redis) == (Path("f.toml"), "redis://after")
    before = parser.parse_args(["--config", "g.toml", *action, "--redis", "redis://after"])
    assert (before.config, before.redis) == (Path("g.toml"), "redis://after")
    neither = parser.parse_args(action)
    assert (neither.config, neither.redis) == (None, None)


def test_verify_never_prints_the_token_of_a_sources_url(redis_server: LocalRedis, job: str) -> None:
    """A provider's key in the Horizon URL (``https://KEY@host``, ``?token=``) stays out of what
    ``verify`` prints when the source cannot be read (its error text names the URL too)."""
    client: redis.Redis = connect(redis_server.url, timeout=2.0)
    client.hset(job_keys(job)["cursor"], mapping={"cursor": "12", "source": "horizon /operations"})
    entry = {"paging_token": "12", "token": "1", "node": "n1", "record": "{}"}  # as a commit writes it
    client.xadd(job_keys(job)["events"], entry)  # type: ignore[arg-type]
    horizon = f"http://KEY123@127.0.0.1:{closed_port()}/?token=KEY123"
    done = run("verify", "--redis", redis_server.url, "--job", job, "--horizon", horizon)
    assert done.returncode == 1 and "cannot read http://***@127.0.0.1:" in done.stderr, done.stderr
    assert "ConnectError" in done.stderr  # (the source unreachable: the path that names its URL)
    assert "KEY123" not in done.stdout + done.stderr
    client.close()
