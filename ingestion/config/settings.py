"""The whole configuration (:class:`Settings`) and how a nested mapping becomes one."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from ingestion.config.checks import check_type, check_values, derive, did_you_mean, without_derived_noise
from ingestion.config.jobs import resolve_jobs
from ingestion.config.schema import JOB_SECRETS, SCHEMA
from ingestion.config.sections import (
    ApiSettings,
    EventsSettings,
    HorizonSettings,
    JobSettings,
    LakeSettings,
    LeaseSettings,
    LogSettings,
    NetworkSettings,
    NodeSettings,
    ObserveSettings,
    RedisSettings,
    RpcSettings,
    SinkSettings,
)


class ConfigError(Exception):
    """One or more settings are wrong; ``problems`` holds one line per problem."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


@attrs.frozen
class Settings:
    node: NodeSettings
    redis: RedisSettings
    lease: LeaseSettings
    horizon: HorizonSettings
    rpc: RpcSettings
    events: EventsSettings
    observe: ObserveSettings
    log: LogSettings
    jobs: tuple[JobSettings, ...] = ()
    sink: SinkSettings = attrs.field(factory=lambda: SinkSettings("", "ingestion"))
    lake: LakeSettings = attrs.field(factory=lambda: LakeSettings("", "", 1000, 4, 1))
    api: ApiSettings = attrs.field(factory=ApiSettings)
    network: NetworkSettings = attrs.field(factory=NetworkSettings)

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any]) -> Settings:
        """Validate a nested mapping (missing keys take defaults) into Settings.

        Raises:
            ConfigError: with one line per problem.
        """
        problems: list[str] = []
        values: dict[str, dict[str, Any]] = {}
        job_tables = raw.get("jobs", {})
        secrets = raw.get(JOB_SECRETS, {})
        raw = {k: v for k, v in raw.items() if k not in ("jobs", JOB_SECRETS)}
        for section, value in raw.items():
            if section not in SCHEMA:
                problems.append(f"{section}: unknown section{did_you_mean(section, SCHEMA)}")
            elif not isinstance(value, Mapping):
                problems.append(f"{section}: must be a table of settings")
        for section, keys in SCHEMA.items():
            given = raw.get(section, {})
            given = given if isinstance(given, Mapping) else {}
            values[section] = {}
            for key in given:
                if key not in keys:
                    problems.append(f"{section}.{key}: unknown setting{did_you_mean(key, keys)}")
            for key, (kind, default, _help) in keys.items():
                value = given.get(key, default)
                checked = check_type(f"{section}.{key}", kind, value, problems)
                values[section][key] = checked if checked is not None else default
        derived = derive(values)
        check_values(values, problems)
        jobs = resolve_jobs(values, job_tables, problems, secrets)
        problems = without_derived_noise(problems, derived)
        if problems:
            raise ConfigError(problems)
        v = values
        node = v["node"]
        return cls(
            node=NodeSettings(
                id=node["id"], jobs=tuple(j.name for j in jobs), state_dir=node["state_dir"],
                source=node["source"],
            ),
            jobs=jobs,
            redis=RedisSettings(**v["redis"]),
            lease=LeaseSettings(**v["lease"]),
            horizon=HorizonSettings(**{**v["horizon"], "urls": tuple(v["horizon"]["urls"])}),
            rpc=RpcSettings(**{
                **v["rpc"], **{k: tuple(v["rpc"][k]) for k in ("urls", "contract_ids", "topics")}
            }),
            events=EventsSettings(**v["events"]),
            observe=ObserveSettings(**v["observe"]),
            log=LogSettings(**v["log"]),
            sink=SinkSettings(**v["sink"]),
            lake=LakeSettings(**v["lake"]),
            api=ApiSettings(**v["api"]),
            network=NetworkSettings(**v["network"]),
        )
