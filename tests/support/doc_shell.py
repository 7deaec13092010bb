"""The shell blocks of README.md and docs/*.md, as tests/docs/test_shell_blocks.py reads them.

A shell block is a fenced block tagged ``sh``, ``bash``, ``shell`` or ``console``, or an untagged
one holding a command line that invokes the project (``ingestion ...``, ``python -m ingestion ...``,
``.venv/bin/ingestion ...``, ``./scripts/...``). Its command lines are what a reader would type:
continuation lines (``\\``) joined, a ``console`` block's ``$ `` prompt removed (the lines under a
prompted line are that command's shown output), the ``#`` comment kept apart, and a line cut into
commands at ``|``, ``&&``, ``||``, ``;`` and ``&``. Everything here only reads the documents; the test
decides what to run.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import attrs

from ingestion.testing.launch import stop_process
from ingestion.testing.local_redis import free_port

T = TypeVar("T")

ROOT = Path(__file__).resolve().parents[2]
SHELL_TAGS = ("sh", "bash", "shell", "console")
OPERATORS = ("|", "||", "&&", ";", "&")
PYTHONS = ("python", "python3", ".venv/bin/python", ".venv/bin/python3")
_FENCE = re.compile(r"^(\s*)(```+)\s*([\w+-]*)")


def documents() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


@attrs.frozen
class Invocation:
    """One command of a command line that runs the project: ``ingestion`` (any spelling of it),
    ``python -m MODULE`` (a module of the project other than ``ingestion`` itself) or a script."""

    kind: str  # "ingestion", "module" or "script"
    target: str  # "ingestion", the module's name, or the script's path as written
    args: tuple[str, ...]  # what follows the program (placeholders such as ... left as written)
    words: tuple[str, ...]  # the whole command as written (shell words)


@attrs.frozen
class CommandLine:
    path: str  # the document, relative to the repository
    line: int  # where the command starts in it (1-based)
    text: str  # the command as typed (continuations joined, prompt and comment removed)
    comment: str  # its ``#`` comment, without the ``#``
    output: tuple[str, ...]  # a console block's shown output under it

    def commands(self) -> list[tuple[str, ...]]:
        """The line's commands, cut at the shell's control operators (``|``, ``&``, ...)."""
        lexer = shlex.shlex(self.text, posix=True)
        lexer.whitespace_split = True
        lexer.commenters = ""
        words = list(lexer)
        if any(w.startswith("[") for w in words):  # a usage line: its | are alternatives
            return [tuple(words)]
        parts: list[list[str]] = [[]]
        for word in words:
            if word in OPERATORS:
                parts.append([])
            elif word.endswith(";") and word != ";":
                parts[-1].append(word[:-1])
                parts.append([])
            else:
                parts[-1].append(word)
        return [tuple(p) for p in parts if p]

    @property
    def background(self) -> bool:
        return self.text.rstrip().endswith("&") and not self.text.rstrip().endswith("&&")

    def invocations(self) -> list[Invocation]:
        return [i for i in (invocation(words) for words in self.commands()) if i is not None]

    def where(self) -> str:
        return f"{self.path}:{self.line}: {self.text}"


@attrs.frozen
class Block:
    path: str  # the document, relative to the repository
    line: int  # the opening fence's line (1-based)
    tag: str  # the fence's tag ("" when untagged)
    lines: tuple[str, ...]  # its content

    @property
    def first(self) -> str:
        return next((x.strip() for x in self.lines if x.strip()), "")

    def where(self) -> str:
        return f"{self.path}:{self.line} ({self.first[:60]!r})"

    def command_lines(self) -> list[CommandLine]:
        found: list[CommandLine] = []
        pending: list[str] = []
        start = 0
        for number, raw in enumerate(self.lines, self.line + 1):
            text = raw.strip()
            if self.tag == "console" and not pending:
                if not text.startswith("$ "):
                    if found and text:
                        last = found[-1]
                        found[-1] = attrs.evolve(last, output=(*last.output, raw))
                    continue
                text = text[2:]
            if not pending:
                start = number
                if not text:
                    continue
            if text.endswith("\\"):
                pending.append(text[:-1].strip())
                continue
            pending.append(text)
            command, comment = split_comment(" ".join(pending))
            pending = []
            if command:
                found.append(CommandLine(self.path, start, command, comment, ()))
        return found

    def invocations(self) -> list[tuple[CommandLine, Invocation]]:
        """Every invocation of the project in the block, in the lines the shell can read (in an
        untagged block, prose, a diagram or shown output may leave a quote open)."""
        found: list[tuple[CommandLine, Invocation]] = []
        for line in self.command_lines():
            try:
                found += [(line, i) for i in line.invocations()]
            except ValueError:
                continue
        return found


def split_comment(text: str) -> tuple[str, str]:
    """``text`` without its shell comment (a ``#`` at a word's start, outside quotes), and the
    comment."""
    quote = ""
    for index, char in enumerate(text):
        if quote:
            if char == quote:
                quote = ""
        elif char in "'\"":
            quote = char
        elif char == "#" and (index == 0 or text[index - 1].isspace()):
            return text[:index].strip(), text[index + 1 :].strip()
    return text.strip(), ""


def invocation(words: tuple[str, ...]) -> Invocation | None:
    """``words`` as an invocation of the project, or None (``redis-server``, ``curl``, ``kill``, ...)."""
    rest = list(words)
    while rest and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", rest[0]):  # VAR=value before the program
        rest.pop(0)
    if not rest:
        return None
    program = rest[0]
    if program in ("ingestion", ".venv/bin/ingestion"):
        return Invocation("ingestion", "ingestion", tuple(rest[1:]), words)
    if program in PYTHONS and len(rest) >= 3 and rest[1] == "-m" and rest[2].split(".")[0] == "ingestion":
        kind = "ingestion" if rest[2] == "ingestion" else "module"
        return Invocation(kind, rest[2], tuple(rest[3:]), words)
    if re.fullmatch(r"(\./)?scripts/[\w.-]+", program):
        return Invocation("script", program, tuple(rest[1:]), words)
    return None


def blocks() -> list[Block]:
    """Every shell block of README.md and docs/*.md, in order."""
    found: list[Block] = []
    for document in documents():
        path = str(document.relative_to(ROOT))
        lines = document.read_text().splitlines()
        index = 0
        while index < len(lines):
            opening = _FENCE.match(lines[index])
            if not opening:
                index += 1
                continue
            fence = opening.group(2)
            end = index + 1
            while end < len(lines) and not lines[end].strip().startswith(fence):
                end += 1
            block = Block(path, index + 1, opening.group(3), tuple(lines[index + 1 : end]))
            if block.tag in SHELL_TAGS or (block.tag == "" and block.invocations()):
                found.append(block)
            index = end + 1
    return found


# -- the project's own parsers ----------------------------------------------------------------------


def subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def is_synopsis(args: tuple[str, ...]) -> bool:
    """A usage line (``inspect [--job NAME] [--json]``, ``replay JOB --from ID|LEDGER|TIME``) rather
    than a command: optional parts in brackets, alternatives, or a metavar in capitals for a
    positional argument."""
    return any(a.startswith("[") or a.endswith("]") or a == "|" for a in args) or any(
        "|" in a and a.isupper() for a in args
    )


def synopsis_problems(parser: argparse.ArgumentParser, args: tuple[str, ...]) -> list[str]:
    """What in the usage line ``args`` the parser does not know: each ``--flag`` shown must be one of
    the (sub)parser it is given to, each sub-action (``webhooks replay``) one of its parser's."""
    problems: list[str] = []
    current = parser
    for word in args:
        bare = word.strip("[]")
        if bare.startswith("--"):
            flag = bare.split("=")[0]
            if flag not in current._option_string_actions:
                problems.append(f"{current.prog} has no flag {flag}")
        elif bare and not bare.startswith("-") and subparsers(current) and not bare.isupper():
            choices = subparsers(current)
            if bare not in choices:
                problems.append(f"{current.prog} has no action {bare!r} (one of {', '.join(choices)})")
            else:
                current = choices[bare]
    return problems


# -- running a block's commands against local services ---------------------------------------------


DOC_REDIS_PORT = 6379  # the documents' Redis, 127.0.0.1:6379 (every command's default)
_PORT_FLAG = re.compile(r"--[\w-]*port")
_LOOPBACK_PORT = re.compile(r"127\.0\.0\.1:(\d+)")


@attrs.define
class Runner:
    """Runs documented commands as typed, on this machine's own services: the documents' Redis
    (127.0.0.1:6379, also the default of every command, through ``INGESTION_REDIS_URL``) is
    ``redis_url``'s server, every other port a document names is a free one of its own (the same
    one each time it is named), and the working directory is ``cwd`` (a temporary one: no
    ``config.toml`` but what the test writes there). Every program spelling of the project runs as
    ``python -m ingestion`` with this interpreter."""

    redis_url: str
    cwd: Path
    ports: dict[int, int] = attrs.Factory(dict)
    env: dict[str, str] = attrs.Factory(dict)  # extra variables
    started: list[subprocess.Popen[bytes]] = attrs.Factory(list)

    def __attrs_post_init__(self) -> None:
        address = self.redis_url.split("//", 1)[1].split("/")[0]  # redis://127.0.0.1:PORT/DB
        self.ports.setdefault(DOC_REDIS_PORT, int(address.rsplit(":", 1)[1]))

    def port(self, documented: int) -> int:
        if documented not in self.ports:
            self.ports[documented] = free_port()
        return self.ports[documented]

    def substitute(self, word: str, after: str = "") -> str:
        """``word`` of a documented command (``after`` the word before it) on this test's services."""
        word = _LOOPBACK_PORT.sub(lambda m: f"127.0.0.1:{self.port(int(m.group(1)))}", word)
        if _PORT_FLAG.fullmatch(after) and word.isdigit() and word != "0":
            word = str(self.port(int(word)))
        return word

    def argv(self, call: Invocation) -> list[str]:
        assert call.kind == "ingestion", call
        args, previous = [], ""
        for word in call.args:
            args.append(self.substitute(word, previous))
            previous = word
        return [sys.executable, "-m", "ingestion", *args]

    def environment(self) -> dict[str, str]:
        base = {k: v for k, v in os.environ.items() if not k.startswith("INGESTION_")}
        return {**base, "PYTHONUNBUFFERED": "1", "INGESTION_REDIS_URL": self.redis_url, **self.env}

    def run(self, call: Invocation, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.argv(call), cwd=self.cwd, env=self.environment(), capture_output=True, text=True,
            timeout=timeout,
        )  # fmt: skip

    def start(self, call: Invocation, name: str) -> Started:
        """``call`` in the background (a line ending in ``&``), its output in a file of ``cwd``."""
        out = self.cwd / f"{name}.out"
        with out.open("wb") as sink:
            process = subprocess.Popen(
                self.argv(call), cwd=self.cwd, env=self.environment(), stdout=sink,
                stderr=subprocess.STDOUT,
            )  # fmt: skip
        self.started.append(process)
        return Started(process, out)

    def stop_all(self) -> None:
        for process in reversed(self.started):
            stop_process(process)


@attrs.frozen
class Started:
    process: subprocess.Popen[bytes]
    out: Path

    def text(self) -> str:
        return self.out.read_text(errors="replace")

    def stop(self, sig: int = signal.SIGTERM, within: float = 10) -> int:
        """Send ``sig`` and wait for the exit status."""
        self.process.send_signal(sig)
        return self.process.wait(within)


def eventually(check: Callable[[], T | None], within: float, what: str, every: float = 0.1) -> T:
    """The first true value ``check`` returns, polling it for up to ``within`` seconds."""
    deadline = time.monotonic() + within
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {within} s: {what}")
        time.sleep(every)
