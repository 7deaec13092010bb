"""The layers of the configuration and their merge: defaults < ``config.toml`` <
``INGESTION_<SECTION>_<KEY>`` < flags."""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ingestion.config.checks import did_you_mean
from ingestion.config.schema import JOB_SECRETS, SCHEMA
from ingestion.config.settings import ConfigError, Settings


def read_toml(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as f:
            return tomllib.load(f)
    except OSError as exc:
        raise ConfigError([f"--config: cannot read {path}: {exc.strerror}"]) from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError([f"--config: {path} is not valid TOML: {exc}"]) from exc


# ``INGESTION_*`` variables that are not settings: the test suite's recorded data and the example
# projector's job and source (docs/POSTGRES.md). An operator may export them in the node's shell.
NOT_SETTINGS = frozenset({"INGESTION_RECORDED_DATA", "INGESTION_PROJECTOR_JOB", "INGESTION_PROJECTOR_SOURCE"})


def from_environment(environ: Mapping[str, str]) -> dict[str, dict[str, Any]]:
    """``INGESTION_<SECTION>_<KEY>`` variables as a nested mapping (lists are comma-separated;
    ``INGESTION_RPC_TOPICS`` separates topics with ``;``, a topic's segments with ``,``); the
    variables of :data:`NOT_SETTINGS` are left alone."""
    out: dict[str, dict[str, Any]] = {}
    problems: list[str] = []
    for name, value in environ.items():
        if not name.startswith("INGESTION_") or name in NOT_SETTINGS:
            continue
        if name.startswith("INGESTION_JOBS_") and name.endswith("_SECRET"):
            # a webhook job's secret (INGESTION_JOBS_<NAME>_SECRET), matched to its job by name
            job = name[len("INGESTION_JOBS_") : -len("_SECRET")]
            out.setdefault(JOB_SECRETS, {})[job] = value
            continue
        rest = name[len("INGESTION_") :].lower()
        section, _, key = rest.partition("_")
        if section not in SCHEMA or key not in SCHEMA[section]:
            hint = did_you_mean(rest, {f"{s}_{k}": 1 for s in SCHEMA for k in SCHEMA[s]})
            problems.append(f"{name}: unknown setting{hint}")
            continue
        kind = SCHEMA[section][key][0]
        # A topic is itself comma-separated: INGESTION_RPC_TOPICS separates topics with ';'.
        sep = ";" if (section, key) == ("rpc", "topics") else ","
        parsed: Any = [u.strip() for u in value.split(sep) if u.strip()] if kind == "list[str]" else value
        out.setdefault(section, {})[key] = parsed
    if problems:
        raise ConfigError(problems)
    return out


def merge(*layers: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    merged: dict[str, dict[str, Any]] = {}
    for layer in layers:
        for section, values in layer.items():
            if isinstance(values, Mapping):
                merged.setdefault(section, {}).update(values)
            else:
                merged[section] = values  # type: ignore[assignment]  # reported by from_mapping
    return merged


def load(
    config_path: Path | None,
    environ: Mapping[str, str],
    flags: Mapping[str, Mapping[str, Any]],
) -> Settings:
    """Defaults < config file < environment < flags. ``config_path`` None: ./config.toml if any.

    Raises:
        ConfigError: every problem found, one line each (a bad environment variable and a bad
            value in the file are reported together).
    """
    file = file_layer(config_path)
    problems: list[str] = []
    try:
        env_layer = from_environment(environ)
    except ConfigError as exc:
        problems.extend(exc.problems)
        env_layer = {}
    try:
        settings = Settings.from_mapping(merge(file, env_layer, flags))
    except ConfigError as exc:
        problems.extend(exc.problems)
    if problems:
        raise ConfigError(problems)
    return settings


def file_layer(config_path: Path | None) -> dict[str, Any]:
    """The config file's settings: ``config_path``, else ./config.toml when there is one."""
    if config_path is None:
        candidate = Path("config.toml")
        return read_toml(candidate) if candidate.is_file() else {}
    return read_toml(config_path)


def resolved_with_sources(
    settings: Settings,
    file: Mapping[str, Any],
    env: Mapping[str, Mapping[str, Any]],
    flags: Mapping[str, Mapping[str, Any]],
) -> list[tuple[str, Any, str]]:
    """Every setting as ``(section.key, value in force, where it came from)``: ``flag``, ``env``,
    ``file``, ``default``, or ``auto`` (a default derived from other settings, also when a layer
    asked for it by giving the "auto" value itself, e.g. ``timeout_ms = 0``)."""
    out: list[tuple[str, Any, str]] = []
    for section, keys in SCHEMA.items():
        values = getattr(settings, section)
        for key, (_kind, default, _help) in keys.items():
            value = settings.node.jobs if (section, key) == ("node", "job") else getattr(values, key)
            if isinstance(value, tuple):
                value = list(value)
            source = "default"
            for name, layer in (("flag", flags), ("env", env), ("file", file)):
                given = layer.get(section)
                if isinstance(given, Mapping) and key in given:
                    asked_auto = str(given[key]) == str(default) and value != default
                    source = "auto" if asked_auto else name
                    break
            else:
                if value != default:
                    source = "auto"
            out.append((f"{section}.{key}", value, source))
    return out
