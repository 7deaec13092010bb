"""Configuration: precedence, validation (one line per problem, exit 2), the committed sample."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from actors.lease_store import parse_sentinel_url
from ingestion.cli.run import parser as _run_parser
from ingestion.config import FLAGS, SCHEMA, ConfigError, Settings, load, redact_url, sample_toml
from ingestion.testing.wait import child_env

ROOT = Path(__file__).resolve().parents[2]


def problems_of(raw: dict) -> list[str]:  # type: ignore[type-arg]
    with pytest.raises(ConfigError) as caught:
        Settings.from_mapping(raw)
    return caught.value.problems


def test_committed_config_toml_is_the_generated_sample_and_loads_as_the_defaults() -> None:
    assert (ROOT / "config.toml").read_text() == sample_toml(), (
        "regenerate: python -c 'from ingestion.config import sample_toml; "
        "open(\"config.toml\", \"w\").write(sample_toml())'"
    )
    from_file = load(ROOT / "config.toml", {}, {})
    defaults = Settings.from_mapping({})
    assert from_file.lease == defaults.lease and from_file.redis == defaults.redis
    for section, keys in SCHEMA.items():
        for key in keys:
            assert f"\n{key} = " in sample_toml().split(f"[{section}]")[1]


def test_every_documented_flag_exists() -> None:
    known = {opt for action in _run_parser()._actions for opt in action.option_strings}
    assert set(FLAGS.values()) <= known


@pytest.mark.parametrize("command", ["run", "verify", "inspect"])
def test_each_commands_flags_set_the_settings_the_one_table_names(command: str) -> None:
    """One flag-to-setting map, :data:`FLAGS`, for every command: each flag of the table that the
    command has sets the settings the table names for it; ``verify``'s and ``inspect``'s
    ``--horizon`` and ``--rpc`` (the source to ask) set none."""
    from ingestion.cli import parser_of
    from ingestion.cli.usage import settings_of_flags

    parser = parser_of(command)
    assert parser is not None
    actions = {opt: action for action in parser._actions for opt in action.option_strings}
    argv: list[str] = []
    for flag in sorted(set(FLAGS.values()) & set(actions)):
        action = actions[flag]
        value = str(next(iter(action.choices))) if action.choices else "7" if action.type is int else "v"
        argv += [flag, value]
    ns = parser.parse_args(argv)
    layer = settings_of_flags(ns, besides={("horizon", "urls"), ("rpc", "urls")} if command != "run" else ())
    expected: dict[str, dict[str, object]] = {}
    for (section, key), flag in FLAGS.items():
        if flag in actions and not (command != "run" and key == "urls"):
            given = getattr(ns, actions[flag].dest)
            single_job = key == "job" and isinstance(given, str)
            expected.setdefault(section, {})[key] = [given] if single_job else given
    assert layer == expected
    assert len(argv) >= 10 if command != "inspect" else len(argv) >= 6


@pytest.mark.parametrize(
    "url", ["http://h:8000/x", "https://h", "ftp://h", "http://user@", "http:///x", "http://h:abc", "http://[::1"]
)
def test_the_config_takes_the_source_urls_the_sources_take(url: str) -> None:
    """One URL check (``common.http.is_http_url``): a URL the configuration accepts is one the
    sources take, and one they refuse is a configuration error, not a traceback at start."""
    from ingestion.common.http import source_urls

    try:
        source_urls(url, "Horizon")
        taken = True
    except ValueError:
        taken = False
    try:
        Settings.from_mapping({"horizon": {"urls": [url]}})
        accepted = True
    except ConfigError:
        accepted = False
    assert accepted == taken


def test_precedence_is_defaults_then_file_then_environment_then_flags(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('[lease]\nttl_ms = 6000\n[node]\njob = "from-file"\nid = "file-node"\n')
    env = {"INGESTION_LEASE_TTL_MS": "7000", "INGESTION_NODE_JOB": "from-env"}
    settings = load(path, env, {"lease": {"ttl_ms": 8000}})
    assert settings.lease.ttl_ms == 8000  # flag beats environment beats file
    assert settings.node.job == "from-env"  # environment beats file
    assert settings.node.id == "file-node"  # file beats default
    assert settings.lease.renew_interval_ms == 1600 and settings.lease.safety_margin_ms == 1600
    assert settings.redis.timeout_ms == 500  # auto: min(500, margin / 2)
    urls = load(None, {"INGESTION_HORIZON_URLS": "http://a:1, http://b:2"}, {}).horizon.urls
    assert urls == ("http://a:1", "http://b:2")


def test_default_node_id_is_host_and_pid() -> None:
    node_id = Settings.from_mapping({}).node.id
    assert node_id.endswith(f"-{os.getpid()}") and len(node_id) > len(str(os.getpid())) + 1


def test_unknown_keys_get_a_did_you_mean() -> None:
    problems = problems_of({"lease": {"ttl": 5000}, "redsi": {}})
    assert "redsi: unknown section (did you mean 'redis'?)" in problems
    assert "lease.ttl: unknown setting (did you mean 'ttl_ms'?)" in problems
    with pytest.raises(ConfigError) as caught:
        load(None, {"INGESTION_LEASE_TTL": "1"}, {})
    assert caught.value.problems == ["INGESTION_LEASE_TTL: unknown setting (did you mean 'lease_ttl_ms'?)"]


def test_wrong_types_and_out_of_range_values_are_each_one_line() -> None:
    problems = problems_of({
        "lease": {"ttl_ms": "soon", "clock_drift": 0.7},
        "observe": {"metrics_port": 70000},
        "horizon": {"urls": ["ftp://x"], "retry_base_ms": -1},
        "log": {"level": "loud"},
        "redis": {"timeout_ms": -5},
    })  # fmt: skip
    assert "lease.ttl_ms: must be int, got 'soon'" in problems
    assert "lease.clock_drift: must be in [0, 0.5), got 0.7" in problems
    assert any(p.startswith("observe.metrics_port: must be a port number") for p in problems)
    assert "horizon.urls: not an http(s) URL: 'ftp://x'" in problems
    assert "horizon.retry_base_ms: must be positive, got -1" in problems
    assert any(p.startswith("log.level: must be one of") for p in problems)
    assert "redis.timeout_ms: must be positive (0: auto), got -5" in problems
    assert all("\n" not in p for p in problems)


def test_renew_interval_and_margin_must_leave_room_inside_the_ttl() -> None:
    problems = problems_of({"lease": {"ttl_ms": 1000, "renew_interval_ms": 600, "safety_margin_ms": 400}})
    assert problems == [
        "lease.renew_interval_ms: 600 leaves no room to renew inside the lease: it must be below "
        "ttl_ms * (1 - clock_drift) - safety_margin_ms = 590"
    ]


def test_redis_timeout_must_fit_inside_the_safety_margin() -> None:
    problems = problems_of({"lease": {"ttl_ms": 5000, "safety_margin_ms": 300}, "redis": {"timeout_ms": 300}})
    assert problems == [
        "redis.timeout_ms: 300 must be below lease.safety_margin_ms (300) so that no Redis call "
        "can outlive the lease"
    ]
    # HTTP timeouts are cancelled by the lease scope: deliberately not tied to the margin.
    Settings.from_mapping({"horizon": {"read_timeout_ms": 60_000}, "lease": {"ttl_ms": 1000}})


def test_tls_files_need_rediss_and_exist(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("x")
    problems = problems_of({"redis": {"url": "redis://h:1/0", "tls_ca_file": str(ca)}})
    assert problems == ["redis.tls_ca_file: only used with a rediss:// URL (redis.url is redis://)"]
    problems = problems_of({"redis": {"url": "rediss://h:1/0", "tls_cert_file": str(tmp_path / "no")}})
    assert f"redis.tls_cert_file: no such file {str(tmp_path / 'no')!r}" in problems
    assert any(p.startswith("redis.tls_cert_file: a client certificate needs both") for p in problems)


def test_bad_redis_url_is_reported_without_its_password() -> None:
    problems = problems_of({"redis": {"url": "http://user:hunter2@host:1"}})
    assert problems == ["redis.url: must start with redis://, rediss://, unix://, redis+sentinel://, "
                        "rediss+sentinel://, redis+cluster:// or rediss+cluster://, got "
                        "'http://user:***@host:1'"]  # fmt: skip
    assert redact_url("rediss://:pw@h:6380/0") == "rediss://:***@h:6380/0"
    assert redact_url("redis://u:p@ss@h:notaport/0") == "redis://u:***@h:notaport/0"
    assert redact_url("redis://h:6379/0") == "redis://h:6379/0"


def test_sentinel_urls_parse_and_say_what_is_missing() -> None:
    ok = Settings.from_mapping(
        {"redis": {"url": "redis+sentinel://u:s3cret@10.0.0.1:26379,[::1]:26380,h3/ingest/2"}}
    )
    assert ok.redis.min_replicas_acked == 1  # auto: one replica must acknowledge with Sentinel
    target = parse_sentinel_url(ok.redis.url)
    assert target.sentinels == (("10.0.0.1", 26379), ("::1", 26380), ("h3", 26379))
    assert (target.service, target.db, target.username, target.password, target.tls) == (
        "ingest", 2, "u", "s3cret", False
    )
    assert parse_sentinel_url("rediss+sentinel://:pw@h:1/svc").tls
    assert Settings.from_mapping({"redis": {"url": "redis://h:1/0"}}).redis.min_replicas_acked == 0
    explicit = {"url": "redis+sentinel://h:1/svc", "min_replicas_acked": 0}
    assert Settings.from_mapping({"redis": explicit}).redis.min_replicas_acked == 0
    assert problems_of({"redis": {"url": "redis+sentinel://:pw@/svc"}}) == [
        "redis.url: 'redis+sentinel://:***@/svc' names no sentinel "
        "(expected redis+sentinel://HOST:PORT[,HOST:PORT...]/SERVICE)"
    ]
    assert problems_of({"redis": {"url": "redis+sentinel://h:1,h:2"}}) == [
        "redis.url: 'redis+sentinel://h:1,h:2' names no service "
        "(expected .../SERVICE[/DB] after the sentinel addresses)"
    ]
    assert problems_of({"redis": {"url": "redis+sentinel://h:x/svc"}}) == [
        "redis.url: 'redis+sentinel://h:x/svc' sentinel address 'h:x' is not HOST:PORT"
    ]
    assert problems_of({"redis": {"url": "redis://h:1/0", "min_replicas_acked": 99}}) == [
        "redis.min_replicas_acked: must be between 0 and 16 (-1: auto), got 99"
    ]


def test_cli_exits_2_with_one_line_per_problem_naming_the_setting(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[lease]\nttl_ms = 50\nrenew_intervall_ms = 3\n")
    env = child_env()
    env["INGESTION_OBSERVE_STATUS_PORT"] = "x"
    done = subprocess.run(
        [sys.executable, "-m", "ingestion", "--config", str(bad), "--redis", "redis://:pw@h:1/0",
         "--lease-ttl-ms", "50"],
        capture_output=True, text=True, timeout=30, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert "ingestion: configuration error: lease.ttl_ms: must be between 100 and 3600000, got 50" in lines
    assert any("lease.renew_intervall_ms: unknown setting (did you mean 'renew_interval_ms'?)" in x
               for x in lines)  # fmt: skip
    assert any("observe.status_port: must be int, got 'x'" in x for x in lines)
    assert all(x.startswith("ingestion: configuration error: ") for x in lines)
    assert "pw" not in done.stderr


def test_no_secret_or_url_credential_shows_in_a_repr() -> None:
    """A repr ends up in tracebacks, debug logs and test output: settings show their URLs
    redacted, and a Sentinel target never its password."""
    settings = Settings.from_mapping({
        "redis": {"url": "redis://u:KEY123@10.0.0.1:6379/0"},
        "sink": {"url": "postgresql://u:KEY123@db/x"},
        "horizon": {"urls": ["https://KEY123@horizon.example/?apikey=KEY123"]},
    })  # fmt: skip
    shown = repr(settings)
    assert "KEY123" not in shown and "redis://u:***@10.0.0.1:6379/0" in shown
    assert "KEY123" not in repr(parse_sentinel_url("redis+sentinel://u:KEY123@h:26379/svc"))
