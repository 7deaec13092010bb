"""``[api]``: the projector job it adds, and the caps and sinks it refuses."""

from __future__ import annotations

import pytest

from ingestion.api.service import ApiStartError, build_app, listen_host_of, read_url_of
from ingestion.config import ConfigError, Settings
from ingestion.config.jobs import API_PROJECTOR_ACTION

BASE = {
    "node": {"source": "rpc"},
    "rpc": {"urls": ["http://127.0.0.1:1"]},
    "sink": {"url": "postgresql://h/db"},
}


def settings(**api: object) -> Settings:
    return Settings.from_mapping({**BASE, "api": api})


def test_serving_a_job_adds_its_fenced_projector_job() -> None:
    s = settings(job="rpc", port=8000)
    assert [j.name for j in s.jobs] == ["rpc", "api.rpc"]
    projector = s.jobs[1]
    assert (projector.kind, projector.action, projector.sink) == (
        "scheduled",
        API_PROJECTOR_ACTION,
        "postgresql://h/db",
    )
    assert read_url_of(s) == "postgresql://h/db" and listen_host_of(s) == "127.0.0.1"
    assert read_url_of(settings(job="rpc", read_url="postgresql://replica/db")) == "postgresql://replica/db"
    assert [j.name for j in settings().jobs] == ["rpc"]  # no [api] job: nothing added


@pytest.mark.parametrize(
    ("api", "problem"),
    [
        ({"job": "rpc", "max_filters": 4}, "api.max_filters: must be at least stellar-rpc's 5"),
        ({"job": "rpc", "max_limit": 100}, "api.max_limit: must be at least stellar-rpc's 10000"),
        ({"port": 8000}, "api.port: the events API needs api.job"),
        ({"job": "rpc", "read_url": "redis://x"}, "api.read_url: must be a postgresql:// URL"),
    ],
)
def test_caps_below_stellar_rpcs_and_a_port_without_a_job_are_refused(
    api: dict[str, object], problem: str
) -> None:
    with pytest.raises(ConfigError) as refused:
        settings(**api)
    assert any(p.startswith(problem) for p in refused.value.problems), refused.value.problems


def test_a_job_on_the_redis_stream_cannot_be_served() -> None:
    with pytest.raises(ConfigError) as refused:
        Settings.from_mapping({**BASE, "sink": {"url": ""}, "api": {"job": "rpc"}})
    assert any(
        "api.job: the events API serves a job whose sink is PostgreSQL" in p for p in refused.value.problems
    )
    with pytest.raises(ApiStartError, match=r"api\.job"):
        build_app(settings(), None)
