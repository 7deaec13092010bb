"""The shell blocks of README.md and docs/*.md stay true (issue #39).

Every fenced shell block (``sh``, ``bash``, ``shell``, ``console``, or an untagged block holding a
command that invokes the project: tests/support/doc_shell.py) is, by its document and the start of
its first line, either RUN below against real local services, or in NOT_RUN with the reason. A new
block that is neither fails ``test_every_shell_block_is_run_or_listed``, and so does an entry that
no longer names a block.

Whatever happens to a block, every command in it that invokes the project is checked against the
project itself: ``ingestion COMMAND ...`` (any spelling) is parsed by that command's real argparse
parser (``ingestion.cli.parser_of``: the command exists, every flag and action shown is accepted
with the values shown; a usage line's flags are looked up in the parser), ``python -m
ingestion.MODULE`` names a module that exists, and ``./scripts/NAME`` is an executable file in the
repository whose flags parse as the command it runs.

The blocks that run, run as typed: their own text, read from the document, with the documents'
Redis (127.0.0.1:6379) replaced by a private redis-server and every other port by a free one
(tests/support/doc_shell.py's Runner); what the block shows (its comments, a console block's
output) and what the prose around it promises is then checked.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tomllib
import urllib.error
import urllib.request
from collections.abc import Callable
from importlib import import_module
from importlib.util import find_spec
from pathlib import Path

import attrs
import pytest

from ingestion.cli import COMMANDS, parser_of
from ingestion.cli.usage import UsageError
from ingestion.simulator.chain import Chain
from ingestion.simulator.records import ChainSpec
from ingestion.testing.local_redis import LocalRedis
from tests.support import doc_shell
from tests.support.deliveries import delivery
from tests.support.doc_shell import ROOT, Block, CommandLine, Invocation, Runner, eventually
from tests.support.ports import closed_port

Key = tuple[str, str]  # (document, the start of the block's first line)

# Run by the test named (the block's lines that are not run are said there).
RUN: dict[Key, str] = {
    ("README.md", "redis-server --port 6379 --save"): "test_readme_running_it_by_hand",
    ("docs/CONSUMING.md", "python -m ingestion tail --redis"): "test_readme_running_it_by_hand",
    ("docs/OPERATIONS.md", "python -m ingestion watch ws://"): "test_readme_running_it_by_hand",
    ("docs/SOURCES.md", "ingestion simulate --port 8000 --rpc-port"): "test_sources_rpc_job",
    ("docs/CONSUMING.md", "ingestion watchlist add deposits"): "test_consuming_deposit_detection",
    ("docs/WEBHOOKS.md", "ingestion webhooks status"): "test_webhooks_commands",
    ("docs/BACKFILL.md", "ingestion simulate --port 8000"): "test_backfill_two_spans_run_to_done",
    ("docs/WEBHOOKS.md", "WEBHOOK_SECRET="): "test_webhooks_receiver_keeps_its_fence",
}

# Deliberately not run (their project commands are still parsed, their scripts checked), and why.
NOT_RUN: dict[Key, str] = {
    ("README.md", "./scripts/demo"): (
        "./scripts/demo runs a three-node cluster for about a minute and ./scripts/test is this very "
        "suite; both first install with Debian's package manager (scripts/setup)"
    ),
    ("docs/API.md", "ingestion api --config"): (
        "a read-only server that runs until stopped, on a config of the reader's; tests/api/test_cli.py "
        "runs it as a process on a real PostgreSQL"
    ),
    ("docs/BACKFILL.md", "ingestion backfill ops"): (
        "needs an RPC whose history holds ledgers 50000000-50999999 and nodes hosting job ops; "
        "the same document's walk on the simulator runs (test_backfill_two_spans_run_to_done)"
    ),
    ("docs/FAILOVER.md", "redis-server --port 6379 --appendonly"): (
        "three nodes killed by pids it leaves to the reader (<leader pid>); the same cluster as "
        "README's by-hand block, which runs, and tests/election measure these takeovers"
    ),
    ("docs/OPERATIONS.md", "ingestion verify ["): "a usage line, not a command (its flags are checked)",
    ("docs/OPERATIONS.md", "ingestion audit JOB"): "a usage line, not a command (its flags are checked)",
    ("docs/OPERATIONS.md", "python -m ingestion inspect ["): "a usage line (its flags are checked)",
    ("docs/OPERATIONS.md", "ingestion run --job ops=/operations"): (
        "placeholders (--redis ... --horizon ...) and a node that runs until stopped; "
        "tests/node runs many jobs per node"
    ),
    ("docs/OPERATIONS.md", "ingestion cursor reset events"): (
        "needs a job whose network was reset; tests/node/test_network.py runs the same command "
        "after a simulator reset"
    ),
    ("docs/OPERATIONS.md", "useradd --system"): (
        "installs as root into /opt, /etc and systemd (users, files, a unit): tests/deploy checks the "
        "unit; its check-config line is parsed"
    ),
    ("docs/REFERENCE.md", "usage: ingestion"): (
        "`ingestion --help`'s output, generated from the code: tests/cli/test_reference.py keeps it current"
    ),
    ("docs/RELIABILITY.md", "./scripts/chaos"): (
        "chaos campaigns of 30 s to 18 min (one must fail); tests/chaos runs the 60 s one"
    ),
}

# What a script's flags are: the parser of the command it execs, or None (its flags are not the
# project's: ./scripts/test passes them to pytest).
SCRIPT_PARSERS: dict[str, Callable[[], argparse.ArgumentParser] | None] = {
    "scripts/demo": lambda: _parser("demo"),
    "scripts/chaos": lambda: import_module("chaos.__main__").parser(),
    "scripts/test": None,
    "scripts/setup": None,
}

BLOCKS = doc_shell.blocks()
CALLS = [(line, call) for block in BLOCKS for line, call in block.invocations()]


def _key_of(block: Block) -> list[Key]:
    return [k for k in (*RUN, *NOT_RUN) if k[0] == block.path and block.first.startswith(k[1])]


def _block(key: Key) -> Block:
    """The block of document ``key[0]`` whose first line starts with ``key[1]``."""
    (found,) = [b for b in BLOCKS if b.path == key[0] and b.first.startswith(key[1])]
    return found


def _parser(command: str) -> argparse.ArgumentParser:
    parser = parser_of(command)
    assert parser is not None
    return parser


def test_the_documents_hold_shell_blocks() -> None:
    assert len(BLOCKS) >= 10 and len(CALLS) >= 25, (len(BLOCKS), len(CALLS))


def test_every_shell_block_is_run_or_listed() -> None:
    unlisted = [b.where() for b in BLOCKS if not _key_of(b)]
    twice = [b.where() for b in BLOCKS if len(_key_of(b)) > 1]
    assert unlisted == [], (
        "a new shell block: run it in tests/docs/test_shell_blocks.py (RUN), or say in NOT_RUN why not"
    )
    assert twice == []
    stale = [k for k in (*RUN, *NOT_RUN) if not [b for b in BLOCKS if k in _key_of(b)]]
    assert stale == [], "these entries name no shell block any more"
    assert set(RUN) & set(NOT_RUN) == set()
    named = {name for name in RUN.values()}
    assert named <= set(globals()), named - set(globals())


def test_every_tagged_shell_block_reads_as_shell() -> None:
    unreadable = []
    for block in (b for b in BLOCKS if b.tag):
        for line in block.command_lines():
            try:
                line.commands()
            except ValueError as exc:  # an unclosed quote
                unreadable.append(f"{line.where()}: {exc}")
    assert unreadable == []


def _ingestion_problems(args: tuple[str, ...]) -> list[str]:
    words = list(args)
    first = words[0].strip("[]") if words else ""
    if first in ("-h", "--help", "help", "-V", "--version"):
        return []
    command = "run"
    if first in COMMANDS:
        command = first
        words.pop(0)
    elif first and not first.startswith("-"):
        return [f"no command {first!r}"]
    parser = parser_of(command)
    if parser is None:
        return [] if not words else [f"{command} takes no flags, shown {words}"]
    if doc_shell.is_synopsis(args):
        return doc_shell.synopsis_problems(parser, tuple(words))
    try:
        parser.parse_args(words)
    except UsageError as exc:
        return [str(exc)]
    return []


def _script_problems(call: Invocation) -> list[str]:
    path = ROOT / call.target
    relative = str(path.relative_to(ROOT))
    if not path.is_file():
        return [f"{call.target}: no such script"]
    problems = [] if os.access(path, os.X_OK) else [f"{call.target} is not executable"]
    if relative not in SCRIPT_PARSERS:
        return [*problems, f"{relative}: say in SCRIPT_PARSERS how its flags are checked"]
    make = SCRIPT_PARSERS[relative]
    if make is not None:
        try:
            args = make().parse_args(call.args)
        except (SystemExit, UsageError):  # argparse's own parser exits, the project's raise
            return [*problems, f"{call.target} does not take {' '.join(call.args)}"]
        if relative == "scripts/chaos" and args.kinds:
            from chaos.faults import BY_NAME

            problems += [f"chaos has no fault kind {k}" for k in args.kinds.split(",") if k not in BY_NAME]
    return problems


@pytest.mark.parametrize(("line", "call"), CALLS, ids=[f"{line.path}:{line.line}" for line, _ in CALLS])
def test_every_documented_command_parses(line: CommandLine, call: Invocation) -> None:
    if call.kind == "ingestion":
        problems = _ingestion_problems(call.args)
    elif call.kind == "module":
        problems = [] if find_spec(call.target) else [f"no module {call.target}"]
    else:
        problems = _script_problems(call)
    if call.words[0] == ".venv/bin/ingestion" and Path(sys.prefix).resolve() == (ROOT / ".venv").resolve():
        if not os.access(ROOT / ".venv/bin/ingestion", os.X_OK):
            problems.append(".venv/bin/ingestion is not installed")
    assert problems == [], line.where()


@pytest.mark.parametrize(
    "args",
    [
        ("inspect", "--nope"),
        ("nonsense", "--job", "a"),
        ("run", "--lease-ttl", "5000"),  # no abbreviations
        ("tail", "--count", "five"),
        ("webhooks", "status", "[--jsn]"),
        ("webhooks", "replay", "JOB", "--form", "ID|LEDGER|TIME"),
        ("webhooks", "[--json]", "statuses"),
        ("version", "--json"),
    ],
)
def test_the_parse_check_refuses_what_the_code_does_not_take(args: tuple[str, ...]) -> None:
    assert _ingestion_problems(args) != []


def test_the_script_check_refuses_what_is_not_there() -> None:
    def call(*words: str) -> Invocation:
        invocation = doc_shell.invocation(words)
        assert invocation is not None and invocation.kind == "script"
        return invocation

    assert _script_problems(call("./scripts/nothing")) != []
    assert _script_problems(call("./scripts/chaos", "--kinds", "no-such-fault")) != []
    assert _script_problems(call("./scripts/demo", "--no-such-flag")) != []
    assert _script_problems(call("./scripts/chaos", "--seconds", "5")) == []


# -- the blocks that run --------------------------------------------------------------------------


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=2) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError:
        return 0, ""


def _body_when_ok(url: str) -> str | None:
    status, body = _get(url)
    return body if status == 200 else None


def _json_lines(text: str) -> list[dict[str, object]]:
    return [json.loads(x) for x in text.splitlines() if x.startswith("{")]


def _only(line: CommandLine) -> Invocation:
    (call,) = line.invocations()
    return call


def _filled(call: Invocation, placeholders: dict[str, str]) -> Invocation:
    """``call`` with its placeholder words (``...``, ``JOB``) given values."""
    return attrs.evolve(call, args=tuple(placeholders.get(a, a) for a in call.args))


def _leader(runner: Runner, inspect: Invocation, job: str) -> str | None:
    done = runner.run(attrs.evolve(inspect, args=(*inspect.args, "--json")))
    assert done.returncode == 0, done.stderr
    shown = json.loads(done.stdout)
    states = shown if isinstance(shown, list) else [shown]
    (state,) = [s for s in states if s["job"] == job]
    leader = state["leader"]
    return str(leader) if leader else None


@pytest.mark.slow
def test_readme_running_it_by_hand(private_redis: LocalRedis, tmp_path: Path) -> None:
    """README's "Running it by hand", as typed (the fixture's redis-server stands for its first
    line), then CONSUMING.md's `tail` lines and OPERATIONS.md's `watch` line against that cluster,
    and README's promise for SIGTERM: exit 0, and the standby takes over at once."""
    lines = _block(("README.md", "redis-server --port 6379 --save")).command_lines()
    assert [x.text.split()[0] for x in lines] == ["redis-server", *[".venv/bin/ingestion"] * 3, "curl",
                                                   ".venv/bin/ingestion"]  # fmt: skip
    runner = Runner(private_redis.url, tmp_path)
    try:
        nodes = {}
        for line in lines[1:4]:
            assert line.background, line.where()
            call = _only(line)
            name = call.args[call.args.index("--node-id") + 1] if "--node-id" in call.args else call.args[0]
            nodes[name] = runner.start(call, name)
        # curl -s 127.0.0.1:9101/readyz   # {"status": "ready", ...} once n1 has joined the election
        curl = lines[4]
        url = "http://" + runner.substitute(curl.commands()[0][-1])
        shown = curl.comment.split(", ...}")[0]
        assert shown.startswith("{"), curl.where()
        body = eventually(lambda: _body_when_ok(url), 30, f"{url} ready")
        assert body.startswith(shown), (curl.where(), body)

        inspect = _only(lines[5])
        done = runner.run(inspect)
        assert done.returncode == 0 and "horizon" in done.stdout, (done.stdout, done.stderr)
        # "One node leads the job `horizon`"
        leader = eventually(lambda: _leader(runner, inspect, "horizon"), 20, "a leader of horizon")
        assert leader in ("n1", "n2")

        _consuming_tail(runner)
        _operations_watch(runner)

        # "SIGTERM/SIGINT stop a node gracefully: the in-flight commit finishes, the lease is released
        # (a standby takes over at once) and the process exits 0."
        standby = {"n1": "n2", "n2": "n1"}[leader]
        assert nodes[leader].stop(signal.SIGTERM) == 0, nodes[leader].text()[-2000:]
        eventually(lambda: _leader(runner, inspect, "horizon") == standby, 3, f"{standby} leads at once")
    finally:
        runner.stop_all()


def _consuming_tail(runner: Runner) -> None:
    """CONSUMING.md, "From the shell: `tail`": the first five, then as consumer group billing (its
    second line, piped into jq and following live, is only parsed)."""
    first, _, group = _block(("docs/CONSUMING.md", "python -m ingestion tail --redis")).command_lines()
    done = runner.run(_only(first))
    records = _json_lines(done.stdout)
    assert done.returncode == 0 and len(records) == 5 == len(done.stdout.splitlines()), first.where()
    tokens = [str(r["paging_token"]) for r in records]
    assert tokens == sorted(tokens, key=lambda t: [int(p) for p in t.split("-")]), tokens
    # "Without --count, tail follows the stream until SIGINT or SIGTERM and exits 0. With --group G it
    # reads as consumer group G (created at the start of the stream when missing)"
    follower = runner.start(_filled(_only(group), {"...": "redis://127.0.0.1:6379/0"}), "tail-billing")
    eventually(lambda: len(_json_lines(follower.text())) >= 5, 20, "tail --group billing prints")
    assert follower.stop(signal.SIGINT) == 0, follower.text()[-2000:]
    assert _json_lines(follower.text())[:5] == records, group.where()


def _operations_watch(runner: Runner) -> None:
    """OPERATIONS.md's `watch` line, its three nodes README's n1 and n2 (status ports) and one that
    is down: the `cluster` line it promises."""
    (line,) = _block(("docs/OPERATIONS.md", "python -m ingestion watch ws://")).command_lines()
    ports = {9101: runner.port(9201), 9102: runner.port(9202), 9103: closed_port()}
    watcher = Runner(runner.redis_url, runner.cwd, ports=ports)
    started = watcher.start(_only(line), "watch")
    try:
        pattern = re.compile(r"cluster  leader: (n1|n2) \(token \d+\) \| standby: (n1|n2) \| down: ")
        eventually(lambda: pattern.search(started.text()), 20, "watch shows the cluster")
    finally:
        started.stop(signal.SIGINT)


@pytest.mark.slow
def test_sources_rpc_job(private_redis: LocalRedis, tmp_path: Path) -> None:
    """SOURCES.md's RPC job as typed: the simulator, a node on `sym:transfer,*,**`, and `tail ... --count
    3`, which exits 2 until the node has committed (the block's comment says so), then prints three
    transfer events."""
    simulate, node, tail = _block(("docs/SOURCES.md", "ingestion simulate --port 8000")).command_lines()
    runner = Runner(private_redis.url, tmp_path)
    try:
        assert simulate.background and node.background, (simulate.where(), node.where())
        runner.start(_only(simulate), "simulate")
        runner.start(_only(node), "n1")
        assert "exit 2" in tail.comment, tail.where()

        def printed() -> subprocess.CompletedProcess[str] | None:
            done = runner.run(_only(tail), timeout=60)
            if done.returncode == 2 and "no job 'transfers'" in done.stderr:
                return None
            return done

        done = eventually(printed, 30, "tail --job transfers", every=0.3)
        assert done.returncode == 0, done.stderr
        events = _json_lines(done.stdout)
        assert len(events) == 3 and all(e["type"] == "contract" for e in events), done.stdout
        assert all(e["topicJson"][0] == {"symbol": "transfer"} for e in events), done.stdout  # type: ignore[index]
    finally:
        runner.stop_all()


def _rpc_healthy(port: int) -> bool:
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "getHealth"}).encode()
    headers = {"content-type": "application/json"}
    request = urllib.request.Request(f"http://127.0.0.1:{port}/", data=body, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=2) as answer:
            return json.loads(answer.read()).get("result", {}).get("status") == "healthy"
    except (OSError, ValueError):
        return False


@pytest.mark.slow
def test_backfill_two_spans_run_to_done(private_redis: LocalRedis, tmp_path: Path) -> None:
    """BACKFILL.md's walk as typed: its TOML as config.toml, the simulator and two nodes, then two
    backfills one after the other, each followed to done (exit 0, no --cancel), --status saying
    done with each range, and inspect showing the ranges under the backfill, none as a job."""
    document = (ROOT / "docs/BACKFILL.md").read_text()
    block = _block(("docs/BACKFILL.md", "ingestion simulate --port 8000"))
    runner = Runner(private_redis.url, tmp_path)
    toml = document.split("```toml\n[jobs.hist]", 1)[1].split("```", 1)[0]
    (tmp_path / "config.toml").write_text(runner.substitute("[jobs.hist]" + toml))
    simulate, n1, n2, first, second, status, inspect = block.command_lines()
    try:
        assert simulate.background and n1.background and n2.background, block.where()
        simulator = runner.start(_only(simulate), "simulate")
        eventually(lambda: "simulator-listening" in simulator.text(), 20, "the simulator")
        nodes = [runner.start(_only(n1), "n1"), runner.start(_only(n2), "n2")]
        eventually(lambda: any('"became-leader"' in n.text() for n in nodes), 30, "a node leads hist")
        # The simulated RPC's history closed in the past: it says healthy once it has closed a live
        # ledger (--ledger-interval 1), as a real RPC always has; backfill asks getHealth first, and
        # on an idle machine the nodes could lead within that first second.
        eventually(lambda: _rpc_healthy(runner.port(8001)), 10, "the simulated RPC healthy")
        done = runner.run(_only(first), timeout=120)
        assert done.returncode == 0, done.stderr
        assert "backfill of hist done: ledgers 50000000..50000039" in done.stdout, done.stdout

        def second_done() -> subprocess.CompletedProcess[str] | None:
            answer = runner.run(_only(second), timeout=120)
            return None if "has committed nothing yet" in answer.stderr else answer  # (as the prose says)

        done = eventually(second_done, 30, "the second backfill", every=0.5)
        assert done.returncode == 0, done.stderr
        assert "backfill of hist planned: ledgers 50000040.." in done.stdout, done.stdout
        assert "backfill of hist done: ledgers 50000040.." in done.stdout, done.stdout
        shown = runner.run(_only(status))
        assert shown.returncode == 0 and ", done (since" in shown.stdout, shown.stdout
        assert shown.stdout.count(": done") + shown.stdout.count(", done\n") >= 2, shown.stdout
        page = runner.run(_only(inspect))
        assert page.returncode == 0 and "in 2 ranges, done:" in page.stdout, page.stdout
        listed = runner.run(Invocation("ingestion", "ingestion", ("inspect", "--json"), ()))
        assert [d["job"] for d in json.loads(listed.stdout)] == ["hist"], listed.stdout
    finally:
        runner.stop_all()


@pytest.mark.slow
def test_consuming_deposit_detection(private_redis: LocalRedis, tmp_path: Path) -> None:
    """CONSUMING.md's deposit detection: its own TOML as config.toml, its watch list filled from a
    file, and `tail --transfers` printing only movements of the watched accounts (the simulator's
    contracts, which every transfer reaches)."""
    document = (ROOT / "docs/CONSUMING.md").read_text()
    block = _block(("docs/CONSUMING.md", "ingestion watchlist add deposits"))
    toml = document.split("```toml\n[jobs.deposits]", 1)[1].split("```", 1)[0]
    (tmp_path / "config.toml").write_text("[jobs.deposits]" + toml)
    assert tomllib.loads("[jobs.deposits]" + toml)["jobs"]["deposits"]["watch_set"] is True
    add, tail = block.command_lines()
    watched = Chain(ChainSpec()).contracts
    (tmp_path / "accounts.txt").write_text("".join(f"{a}\n" for a in watched))
    runner = Runner(private_redis.url, tmp_path)
    try:
        done = runner.run(_only(add))
        assert done.returncode == 0 and f"deposits watches {len(watched)}" in done.stdout, (done, add.where())
        simulator = runner.start(
            Invocation("ingestion", "ingestion", ("simulate", "--port", "0", "--rpc-port", "8001",
                                                  "--ledger-interval", "1"), ()),
            "simulate",
        )  # fmt: skip
        eventually(lambda: "simulator-listening" in simulator.text(), 20, "the simulator")
        node = Invocation("ingestion", "ingestion", ("run", "--node-id", "n1", "--job", "deposits",
                                                     "--metrics-port", "0"), ())  # fmt: skip
        runner.env["INGESTION_RPC_URLS"] = f"http://127.0.0.1:{runner.port(8001)}"
        n1 = runner.start(node, "n1")
        eventually(lambda: '"became-leader"' in n1.text(), 20, "n1 leads deposits")  # tail needs the job
        follower = runner.start(_only(tail), "tail")

        def moved() -> list[list[str]]:
            rows = [x.split("\t") for x in follower.text().splitlines() if "\t" in x]
            return rows if len(rows) >= 3 else []

        rows = eventually(moved, 30, "three transfers")
        # "id, kind, amount, asset, from, to, muxed id", to one of the watched accounts
        assert all(len(r) == 7 and (r[4] in watched or r[5] in watched) for r in rows), rows
        assert follower.stop(signal.SIGINT) == 0
    finally:
        runner.stop_all()


def test_webhooks_commands(private_redis: LocalRedis, tmp_path: Path) -> None:
    """WEBHOOKS.md's commands with its own configuration (the secret from the environment, as its
    comment offers): `status` shows the job, `replay`, `enable`, `pause` and `resume` only ask
    (`requests pending`), `drop-dead-letters` drops (none here), and the secret is never shown."""
    document = (ROOT / "docs/WEBHOOKS.md").read_text()
    toml = document.split("```toml\n", 1)[1].split("```", 1)[0]
    config = "\n".join(x for x in toml.splitlines() if not x.startswith("secret_file"))
    (tmp_path / "config.toml").write_text(config)
    hook = next(name for name, table in tomllib.loads(config)["jobs"].items() if table["kind"] == "webhook")
    secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
    variable = f"INGESTION_JOBS_{hook.upper().replace('-', '_')}_SECRET"
    assert variable in toml, "the documented variable"
    runner = Runner(private_redis.url, tmp_path, env={variable: secret})
    lines = _block(("docs/WEBHOOKS.md", "ingestion webhooks status")).command_lines()
    status, replay_range, replay_dead, drop, enable, pause, resume = lines
    plain = Invocation("ingestion", "ingestion", tuple(a for a in _only(status).args if a != "[--json]"), ())
    done = runner.run(plain)
    assert done.returncode == 0 and done.stdout.startswith(f"{hook}: idle -> "), done
    for line in (replay_dead, enable, pause, resume):
        done = runner.run(_filled(_only(line), {"JOB": hook}))
        assert done.returncode == 0 and "requested" in done.stdout, (line.where(), done)
    assert doc_shell.is_synopsis(_only(replay_range).args)
    dropping = _filled(_only(drop), {"JOB": hook})
    optional = ("[--before", "TIME]")
    bare = Invocation("ingestion", "ingestion", tuple(a for a in dropping.args if a not in optional), ())
    done = runner.run(bare)
    assert done.returncode == 0 and f"dropped 0 dead letters of {hook}" in done.stdout, (drop.where(), done)
    with_json = Invocation("ingestion", "ingestion", ("webhooks", "status", "--json"), ())
    done = runner.run(with_json)
    (shown,) = json.loads(done.stdout)
    assert shown["job"] == hook and shown["requests_pending"] == 4, shown
    assert secret not in done.stdout + done.stderr


def test_webhooks_receiver_keeps_its_fence(tmp_path: Path) -> None:
    """WEBHOOKS.md's receiver command as typed (its port a free one, in a directory of its own):
    it says where its fence is, takes a signed delivery, and restarted on the same file it still
    refuses a lower token (issue 50: it kept everything in memory, a restart reset the fence to 0);
    on a new file its fence is 0, as the warning says."""
    (line,) = _block(("docs/WEBHOOKS.md", "WEBHOOK_SECRET=")).command_lines()
    (call,) = line.invocations()
    assert call.kind == "module" and call.target == "ingestion.testing.receiver"
    program = call.words.index("python")
    env = dict(word.split("=", 1) for word in call.words[:program])
    runner = Runner("redis://127.0.0.1:6379/0", tmp_path, env=env)
    args = [runner.substitute(w, before) for before, w in zip(("", *call.args), call.args, strict=False)]
    db = args[args.index("--db") + 1]
    document = (ROOT / "docs/WEBHOOKS.md").read_text()
    assert f"`--db` defaults to\n`{db}`" in document  # the command shows the default

    def start(*extra: str) -> tuple[subprocess.Popen[bytes], dict[str, object]]:
        out = tmp_path / f"receiver-{len(list(tmp_path.glob('receiver-*')))}.out"
        argv = [sys.executable, "-m", call.target, *args, *extra]
        with out.open("wb") as sink:
            proc = subprocess.Popen(argv, cwd=tmp_path, env=runner.environment(), stdout=sink,
                                    stderr=subprocess.STDOUT)  # fmt: skip
        first = eventually(lambda: out.read_text().partition("\n")[0] if "\n" in out.read_text() else None,
                           30, "the receiver listening")  # fmt: skip
        return proc, json.loads(first)

    def post(port: object, record: int, token: int) -> int:
        headers, body = delivery(record, token)
        request = urllib.request.Request(f"http://127.0.0.1:{port}/hooks", data=body, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=10) as answer:
                return int(answer.status)
        except urllib.error.HTTPError as refused:
            return int(refused.code)

    proc, shown = start()
    try:
        assert shown == {"event": "receiver-listening", "port": runner.port(9000), "db": db, "fence": 0}
        assert post(shown["port"], 1, 7) == 204
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(10) == 0
    assert (tmp_path / db).is_file()
    proc, shown = start()
    try:
        assert shown["fence"] == 7
        assert post(shown["port"], 2, 6) == 409  # a former leader's late POST: still refused
        assert post(shown["port"], 2, 8) == 204
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(10) == 0
    proc, shown = start("--db", "elsewhere.sqlite3")  # a new file: the fence is 0 again
    try:
        assert shown["fence"] == 0 and post(shown["port"], 3, 6) == 204
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(10) == 0
