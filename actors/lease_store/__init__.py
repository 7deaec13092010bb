"""The Redis lease store: the one package that talks to Redis.

It owns the key layout, the Lua scripts that make every election step and every commit atomic,
and the bridge from trio to redis-py. A newcomer finds:

- ``keys``: the key layout (one job's keys under one cluster hash tag; the node registry): the
  runtime's half of the keyspace, the application's being ``ingestion/common/keyspace.py``.
- ``lua/``: one script per atomic operation, each headed by its KEYS, ARGV and answer;
  ``scripts`` reads them once.
- ``connect``: the URL forms (plain, TLS, Sentinel, Cluster), the bounded never-retrying client,
  and failures in an operator's words.
- ``results``: what the calls return, and :class:`RedisUnavailable` (outcome unknown).
- ``state``: the one reader of a job's state (:class:`StateQuery`, :func:`read_states`): the
  commands on a pipeline, the replies parsed into a :class:`JobState`.
- ``store``: :class:`LeaseStore`, one job's lease, token and cursor operations.
- ``registry``: :class:`NodeRegistry`, the live nodes (for balancing, never for safety).
- ``notices``: :class:`ReleaseNotices`, the subscription that wakes standbys on a release.
- ``waits``: :func:`stream_waits`, one blocking read for all of a node's waits for stream entries.

The fencing rule lives inside Redis (``lua/commit.lua``): a commit is applied only if its token
equals the job's token counter *and* the lease still holds exactly this holder and token, *and*
its records follow the stored cursor strictly.
"""

from actors.lease_store.batch import Batch, batch
from actors.lease_store.connect import (
    CLUSTER_SCHEMES,
    SENTINEL_SCHEMES,
    BadRedisUrl,
    ClusterTarget,
    RedisDiagnosis,
    SentinelTarget,
    classify_redis_error,
    connect,
    describe_redis_error,
    diagnose_redis,
    examine_redis,
    is_cluster_url,
    is_sentinel_url,
    parse_cluster_url,
    parse_sentinel_url,
    sentinel_services,
)
from actors.lease_store.keys import (
    AUDIT_MAXLEN,
    DEPLOYMENT_KEY,
    KEY_PATTERN,
    NODE_FORGET_MS,
    NODE_HOSTS_KEY,
    NODE_REGISTRY_KEY,
    discover_jobs,
    job_key,
    job_keys,
    job_of_key,
    parse_lease_value,
)
from actors.lease_store.notices import HANDED_OVER, NODE_EXITING, ReleaseNotices
from actors.lease_store.registry import NodeRegistry
from actors.lease_store.results import (
    Acquired,
    CommitRejected,
    Committed,
    GroupInfo,
    HealthReport,
    Held,
    JobState,
    LeaderInfo,
    RedisUnavailable,
    Renewal,
    ReplicationUnconfirmed,
    StateLost,
    StreamInfo,
)
from actors.lease_store.state import StateQuery, parse_states, read_states
from actors.lease_store.store import FOLLOW_PRIMARY_EVERY, LeaseStore
from actors.lease_store.waits import StreamWaits, stream_waits

__all__ = [
    "AUDIT_MAXLEN",
    "CLUSTER_SCHEMES",
    "DEPLOYMENT_KEY",
    "FOLLOW_PRIMARY_EVERY",
    "HANDED_OVER",
    "KEY_PATTERN",
    "NODE_EXITING",
    "NODE_FORGET_MS",
    "NODE_HOSTS_KEY",
    "NODE_REGISTRY_KEY",
    "SENTINEL_SCHEMES",
    "Acquired",
    "BadRedisUrl",
    "Batch",
    "ClusterTarget",
    "CommitRejected",
    "Committed",
    "GroupInfo",
    "HealthReport",
    "Held",
    "JobState",
    "LeaderInfo",
    "LeaseStore",
    "NodeRegistry",
    "RedisDiagnosis",
    "RedisUnavailable",
    "ReleaseNotices",
    "Renewal",
    "ReplicationUnconfirmed",
    "SentinelTarget",
    "StateLost",
    "StateQuery",
    "StreamInfo",
    "StreamWaits",
    "batch",
    "classify_redis_error",
    "connect",
    "describe_redis_error",
    "diagnose_redis",
    "discover_jobs",
    "examine_redis",
    "is_cluster_url",
    "is_sentinel_url",
    "job_key",
    "job_keys",
    "job_of_key",
    "parse_cluster_url",
    "parse_lease_value",
    "parse_sentinel_url",
    "parse_states",
    "read_states",
    "sentinel_services",
    "stream_waits",
]
