"""What every command's parser shares: one-line usage errors, flag help that names the setting, and
the settings layer the flags make.

A module of its own so that the commands import it, never the command table (``ingestion.cli``).
"""

from __future__ import annotations

import argparse
import copy
import sys
from collections.abc import Collection, Mapping
from typing import Any, NoReturn


class UsageError(Exception):
    """A bad command line: printed as one line, exit 2."""


class OneLineParser(argparse.ArgumentParser):
    """An argument parser whose mistakes are one line (``UsageError``), not usage plus error,
    and that takes no abbreviation of a flag (``--lease-ttl`` is not ``--lease-ttl-ms``: a
    setting's unit is part of its name)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        self._share_flags()
        return super().parse_known_args(args, namespace)

    def _share_flags(self) -> None:
        """A command's flags before its action are taken after it too (``webhooks replay JOB
        --config F``, as kubectl takes them): each action's parser gets a copy of each, whose
        default (``SUPPRESS``) never overwrites the value given before the action."""
        subparsers = [a for a in self._actions if isinstance(a, argparse._SubParsersAction)]
        shared = [
            a for a in self._actions
            if a.option_strings and not isinstance(a, (argparse._HelpAction, argparse._VersionAction))
        ]  # fmt: skip
        for sub in subparsers:
            for child in set(sub.choices.values()):
                for flag in shared:
                    if any(o in child._option_string_actions for o in flag.option_strings):
                        continue  # (its own, or shared already)
                    copied = copy.copy(flag)
                    copied.default = argparse.SUPPRESS
                    copied.required = False
                    child._add_action(copied)

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog.removeprefix('ingestion ')}: {message} (see {self.prog} --help)")


def env_name(section: str, key: str) -> str:
    return f"INGESTION_{section.upper()}_{key.upper()}"


def setting_help(text: str, *settings: tuple[str, str]) -> str:
    """``text`` followed by the setting's default and environment variable (the schema's)."""
    from ingestion.config import SCHEMA  # lazy: CLI start-up: not for --help (~300 ms)

    section, key = settings[0]
    default = SCHEMA[section][key][1]
    shown = ",".join(default) if isinstance(default, list) else default
    if shown == "" or shown == []:
        shown = "none"
    envs = " or ".join(env_name(s, k) for s, k in settings)
    return f"{text} (default: {shown}; env {envs}; setting {section}.{key})".replace("%", "%%")


def settings_of_flags(
    ns: argparse.Namespace, *, besides: Collection[tuple[str, str]] = ()
) -> dict[str, dict[str, Any]]:
    """The settings layer of a command's flags, read off the one table of the settings' flags
    (:data:`ingestion.config.schema.FLAGS`): each setting whose flag the command has and was given
    (a single ``--job`` as a list of one). ``besides``: settings whose flag means something else to
    this command (``verify --horizon URL``: the Horizon to compare with, not the jobs' URLs)."""
    from ingestion.config.schema import FLAGS  # lazy: CLI start-up: not for --help (~300 ms)

    given: dict[tuple[str, str], Any] = {}
    for setting, flag in FLAGS.items():
        if setting in besides:
            continue
        value = getattr(ns, flag.removeprefix("--").replace("-", "_"), None)
        given[setting] = [value] if setting == ("node", "job") and isinstance(value, str) else value
    return flags_layer(given)


def flags_layer(flags: Mapping[tuple[str, str], Any]) -> dict[str, dict[str, Any]]:
    """The settings layer of a command's flags, ``(section, key) -> value``: those given (not None)."""
    layer: dict[str, dict[str, Any]] = {}
    for (section, key), value in flags.items():
        if value is not None:
            layer.setdefault(section, {})[key] = value
    return layer


def quiet_logs() -> None:
    """For a one-shot command that reads sources through their packages: their log lines (a rate
    limit waited out, a page size reduced) go to stderr, warnings and above, never into the
    command's own output on stdout. Left alone when logging is configured already (a node, a test)."""
    import logging  # lazy: CLI start-up (logging, ~5 ms): not for --help

    import structlog  # lazy: CLI start-up (structlog, ~30 ms): not for --help

    if not structlog.is_configured():
        structlog.configure(
            wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
            logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        )
