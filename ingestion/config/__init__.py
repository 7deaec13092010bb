"""Configuration: built-in defaults < ``config.toml`` < ``INGESTION_<SECTION>_<KEY>`` < flags.

Parsed into frozen attrs values. Every problem is reported as one line naming the setting
(``lease.ttl_ms: ...``) and all problems are reported together; the CLI exits with status 2.
Settings whose default is ``0`` marked *auto* are derived from the lease TTL, so that changing only
the TTL always gives a consistent configuration.

- :mod:`~ingestion.config.schema`: every setting (type, default, help), the ``[jobs.NAME]`` keys,
  the flags.
- :mod:`~ingestion.config.sections`: the frozen values, one class per section and per job.
- :mod:`~ingestion.config.checks`: the checks of values and of the relations between settings,
  and the *auto* settings.
- :mod:`~ingestion.config.jobs`: which jobs a node hosts, from ``node.job`` and ``[jobs.NAME]``.
- :mod:`~ingestion.config.settings`: :class:`Settings`, validated from one nested mapping.
- :mod:`~ingestion.config.layers`: reading the file and the environment, merging the layers.
- :mod:`~ingestion.config.sample`: the sample ``config.toml``.
"""

from ingestion.config.checks import default_node_id, redact_url
from ingestion.config.jobs import load_action
from ingestion.config.layers import from_environment, load, merge, read_toml
from ingestion.config.sample import sample_toml
from ingestion.config.schema import FLAGS, JOB_KINDS, JOB_SCHEMA, LOG_LEVELS, SCHEMA
from ingestion.config.sections import (
    EventsSettings,
    HorizonSettings,
    JobSettings,
    LakeSettings,
    LeaseSettings,
    LogSettings,
    NodeSettings,
    ObserveSettings,
    RedisSettings,
    RpcSettings,
)
from ingestion.config.settings import ConfigError, Settings

__all__ = [
    "FLAGS",
    "JOB_KINDS",
    "JOB_SCHEMA",
    "LOG_LEVELS",
    "SCHEMA",
    "ConfigError",
    "EventsSettings",
    "HorizonSettings",
    "JobSettings",
    "LakeSettings",
    "LeaseSettings",
    "LogSettings",
    "NodeSettings",
    "ObserveSettings",
    "RedisSettings",
    "RpcSettings",
    "Settings",
    "default_node_id",
    "from_environment",
    "load",
    "load_action",
    "merge",
    "read_toml",
    "redact_url",
    "sample_toml",
]
