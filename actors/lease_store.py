"""The Redis lease store: the one module that talks to Redis.

It owns the key layout (CONTRACT.md), the Lua scripts that make every election step and every commit
atomic, and the bridge from trio to redis-py's synchronous client (a worker thread per call, with
``abandon_on_cancel`` so a cancelled caller never waits on a socket).

Every call is bounded by the client's socket and connect timeouts, which the configuration keeps well
below the lease safety margin, and redis-py's own retries are switched off: a retry would stretch a
call past the margin. A call that fails or times out raises :class:`RedisUnavailable`, and the caller
must treat it as *ambiguous*: the command may or may not have been applied.

The fencing rule lives here, inside Redis: a commit is applied only if its token equals the job's
token counter *and* the lease still holds exactly this holder and token, *and* its records follow the
stored cursor strictly. Local checks elsewhere are an optimisation; this one is the guarantee.
"""

from __future__ import annotations

import functools
import ssl
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar
from urllib.parse import unquote

import attrs
import redis
import trio
from redis.backoff import NoBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.retry import Retry
from redis.sentinel import MasterNotFoundError, Sentinel, SentinelConnectionPool

from actors.cursor_order import token_key
from actors.source import Record

T = TypeVar("T")

AUDIT_MAXLEN = 10_000
FOLLOW_PRIMARY_EVERY = 0.5  # seconds: how stale the Sentinel-named primary may be (follow_primary)

# Shared Lua helpers. Paging tokens are compared as decimal strings by (length, text) once leading
# zeros are stripped (Stellar RPC's event ids are zero-padded), which is numeric order; Redis's
# Lua numbers are doubles and cannot hold every int64.
_LUA_HELPERS = """
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
-- A decimal without its leading zeros ('0' for zero), or nil when not all digits.
local function digits(s)
  if string.match(s, '^[0-9]+$') == nil then return nil end
  local stripped = string.gsub(s, '^0+', '')
  if stripped == '' then return '0' end
  return stripped
end
local function split_token(t)
  local dash = string.find(t, '-', 1, true)
  local a, b = t, '0'
  if dash then a, b = string.sub(t, 1, dash - 1), string.sub(t, dash + 1) end
  a, b = digits(a), digits(b)
  if not (a and b) then return nil end
  return a, b
end
local function num_lt(a, b)
  if #a ~= #b then return #a < #b end
  return a < b
end
-- nil when (token, node) may write: the token is the counter and the lease holds exactly it;
-- else {reason, current counter}
local function fencing_refusal(token_key, lease_key, node, token)
  local current = tonumber(redis.call('GET', token_key) or '0')
  if current ~= tonumber(token) then return {'stale-token', current} end
  if redis.call('GET', lease_key) ~= token .. '|' .. node then return {'lease-lost', current} end
  return nil
end
-- true when paging token t sorts strictly after paging token prev
local function is_after(t, prev)
  local ta, na = split_token(t)
  local pa, pn = split_token(prev)
  if ta == pa then return num_lt(pn, na) end
  return num_lt(pa, ta)
end

-- Stream ids "ms-seq", compared as numbers (both fit a double for ids from XADD *).
local function id_parts(id)
  local dash = string.find(id, '-', 1, true)
  if not dash then return tonumber(id), 0 end
  return tonumber(string.sub(id, 1, dash - 1)), tonumber(string.sub(id, dash + 1))
end
local function id_lt(a, b)
  local am, as = id_parts(a)
  local bm, bs = id_parts(b)
  if am ~= bm then return am < bm end
  return as < bs
end
local function id_next(id)
  local ms, seq = id_parts(id)
  return string.format('%d-%d', ms, seq + 1)
end
-- Entries of stream `key` from id `from` (inclusive) to `to` (inclusive), counting at most `limit`.
local function count_range(key, from, to, limit)
  return #redis.call('XRANGE', key, from, to, 'COUNT', limit)
end
-- Trim the events stream to about max_len entries, never removing an entry that a consumer group
-- has not acknowledged (pending) or not yet been delivered. Each group needs every entry from its
-- floor: its oldest pending entry, or the one after its last delivered one. With `held` the most
-- entries any group needs (from the oldest floor to the end): when held <= max_len, trimming to
-- max_len entries keeps every needed one; else trim only below the oldest floor. Both trims are
-- approximate (~): Redis drops whole stream nodes only, so they cost next to nothing per commit.
-- Returns the number of entries removed.
local function trim_events(key, max_len)
  if max_len <= 0 or redis.call('XLEN', key) <= max_len then return 0 end
  local groups = redis.call('XINFO', 'GROUPS', key)
  if #groups == 0 then return redis.call('XTRIM', key, 'MAXLEN', '~', max_len) end
  local floor, held = nil, 0
  for _, g in ipairs(groups) do
    local f = {}
    for i = 1, #g, 2 do f[g[i]] = g[i + 1] end
    local pending = redis.call('XPENDING', key, f['name'])
    local lag = f['lag']  -- entries not yet delivered; false when Redis cannot tell
    local g_floor, g_held
    if tonumber(pending[1]) > 0 then
      g_floor = pending[2]
      if lag then
        g_held = lag + count_range(key, g_floor, f['last-delivered-id'], max_len + 1)
      end
    else
      g_floor = id_next(f['last-delivered-id'])
      if lag then g_held = lag end
    end
    if not g_held then g_held = count_range(key, g_floor, '+', max_len + 1) end
    if floor == nil or id_lt(g_floor, floor) then floor = g_floor end
    if g_held > held then held = g_held end
  end
  if held <= max_len then return redis.call('XTRIM', key, 'MAXLEN', '~', max_len) end
  return redis.call('XTRIM', key, 'MINID', '~', floor)
end
"""

# KEYS: lease, token, leader, audit, cursor   ARGV: node, ttl_ms, audit_maxlen, known_token
_ACQUIRE = """
local held = redis.call('GET', KEYS[1])
if held then
  return {0, held, redis.call('PTTL', KEYS[1])}
end
-- The caller has seen fencing token known_token. A counter below it means Redis went back in time:
-- a failover to a replica that missed the newest writes, a restart from an old file, a restore.
local counter = tonumber(redis.call('GET', KEYS[2]) or '0')
local known = tonumber(ARGV[4] or '0')
local cursor = redis.call('HGET', KEYS[5], 'cursor') or ''
if counter < known and cursor == '' then
  -- Not a rollback but a loss: the job's cursor is gone too. Leading would restart the job from
  -- its start cursor; that is an operator's decision, so issue nothing.
  return {2, counter, cursor}
end
local now = now_ms()
-- The counter only ever increases. Floor it at every token known to be used: the caller's, and
-- the committed cursor's (the counter can be lost while the cursor survives). The new token is then
-- above every token this node has seen and every token on a surviving commit.
local floor = math.max(known, tonumber(redis.call('HGET', KEYS[5], 'token') or '0'))
if counter < floor then
  redis.call('SET', KEYS[2], floor)
end
local token = redis.call('INCR', KEYS[2])
redis.call('SET', KEYS[1], token .. '|' .. ARGV[1], 'PX', ARGV[2])
local prev = redis.call('HMGET', KEYS[3], 'node', 'token', 'expires_at_ms')
local takeover = ''
if prev[3] then takeover = math.max(0, now - tonumber(prev[3])) end
local rolled_back = ''
if counter < known then rolled_back = counter end
redis.call('HSET', KEYS[3], 'node', ARGV[1], 'token', token,
  'acquired_at_ms', now, 'expires_at_ms', now + tonumber(ARGV[2]))
local entry = {'event', 'became-leader', 'node', ARGV[1], 'token', token,
  'previous_node', prev[1] or '', 'previous_token', prev[2] or '', 'takeover_ms', takeover}
if rolled_back ~= '' then
  table.insert(entry, 'rolled_back_from')
  table.insert(entry, rolled_back)
end
redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[3], '*', unpack(entry))
return {1, token, prev[1] or '', prev[2] or '', takeover, cursor, rolled_back}
"""

# KEYS: lease, leader   ARGV: node, token, ttl_ms
_RENEW = """
if redis.call('GET', KEYS[1]) ~= ARGV[2] .. '|' .. ARGV[1] then return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[3])
redis.call('HSET', KEYS[2], 'expires_at_ms', now_ms() + tonumber(ARGV[3]))
return 1
"""

# KEYS: lease, leader, audit   ARGV: node, token, channel, audit_maxlen
_RELEASE = """
if redis.call('GET', KEYS[1]) ~= ARGV[2] .. '|' .. ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[2], 'expires_at_ms', now_ms())
redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[4], '*',
  'event', 'released', 'node', ARGV[1], 'token', ARGV[2])
redis.call('PUBLISH', ARGV[3], ARGV[2] .. '|' .. ARGV[1])
return 1
"""

# KEYS: token, lease, cursor, events
# ARGV: node, token, expected previous cursor ('' for none), anchor ('' for none), events max_len
# (0: keep everything), then paging_token, record pairs. The anchor, when given, becomes the cursor
# after the records (it must come after the last of them): alone, it is how a job that starts at
# "now" pins that position durably before its first record; after records, a source's "read
# through here" position (Stellar RPC's scanned-through cursor).
_COMMIT = """
local stored = redis.call('HGET', KEYS[3], 'cursor') or ''
local refusal = fencing_refusal(KEYS[1], KEYS[2], ARGV[1], ARGV[2])
if refusal then return {0, refusal[1], refusal[2], stored} end
local current = tonumber(ARGV[2])
if stored ~= ARGV[3] then return {0, 'cursor-moved', current, stored} end
local last = stored
for i = 6, #ARGV, 2 do
  if not split_token(ARGV[i]) then return {0, 'bad-paging-token', current, stored} end
  if last ~= '' and not is_after(ARGV[i], last) then
    return {0, 'not-after-cursor', current, stored}
  end
  last = ARGV[i]
end
if ARGV[4] ~= '' then
  if not split_token(ARGV[4]) then return {0, 'bad-paging-token', current, stored} end
  if last ~= '' and not is_after(ARGV[4], last) then
    return {0, 'not-after-cursor', current, stored}
  end
  last = ARGV[4]
end
for i = 6, #ARGV, 2 do
  redis.call('XADD', KEYS[4], '*', 'paging_token', ARGV[i], 'token', ARGV[2],
    'node', ARGV[1], 'record', ARGV[i + 1])
end
redis.call('HSET', KEYS[3], 'cursor', last, 'token', ARGV[2], 'node', ARGV[1])
local trimmed = 0
if #ARGV > 5 then trimmed = trim_events(KEYS[4], tonumber(ARGV[5])) end
return {1, (#ARGV - 5) / 2, last, trimmed}
"""


# KEYS: token, lease, target hash   ARGV: node, token, then field, value pairs
# A singleton job's side effect, fenced exactly like a commit: applied only for the current token
# while its holder still holds the lease.
_FENCED_HSET = """
local refusal = fencing_refusal(KEYS[1], KEYS[2], ARGV[1], ARGV[2])
if refusal then return {0, refusal[1], refusal[2]} end
for i = 3, #ARGV, 2 do redis.call('HSET', KEYS[3], ARGV[i], ARGV[i + 1]) end
return {1, 'ok', tonumber(ARGV[2])}
"""

# KEYS: token, lease, audit   ARGV: node, token, audit_maxlen, event, field, value, ...
_FENCED_AUDIT = """
local refusal = fencing_refusal(KEYS[1], KEYS[2], ARGV[1], ARGV[2])
if refusal then return {0, refusal[1], refusal[2]} end
local entry = {'event', ARGV[4], 'node', ARGV[1], 'token', ARGV[2]}
for i = 5, #ARGV do entry[#entry + 1] = ARGV[i] end
redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[3], '*', unpack(entry))
return {1, 'ok', tonumber(ARGV[2])}
"""


# KEYS: the node registry (a sorted set)   ARGV: node, live_ms, forget_ms
# Heartbeat ``node`` with Redis's clock, forget nodes silent for forget_ms, return the live ones.
_NODE_HEARTBEAT = """
local now = now_ms()
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - tonumber(ARGV[3]))
return redis.call('ZRANGEBYSCORE', KEYS[1], now - tonumber(ARGV[2]), '+inf')
"""

# KEYS: the job's health hash   ARGV: node, age_ms of its last source success ('' when unhealthy),
# window_ms. Record the node's last success (Redis time), return the nodes healthy within window_ms.
_REPORT_HEALTH = """
local now = now_ms()
if ARGV[2] ~= '' then redis.call('HSET', KEYS[1], ARGV[1], now - tonumber(ARGV[2])) end
local out = {}
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  if now - tonumber(all[i + 1]) <= tonumber(ARGV[3]) then table.insert(out, all[i]) end
end
return out
"""

NODE_REGISTRY_KEY = "ingestion:nodes"  # its own key (its own cluster slot): no script mixes it with a job's
NODE_FORGET_MS = 3_600_000  # a node silent this long is dropped from the registry


class RedisUnavailable(Exception):
    """A Redis call failed or timed out. Its effect is unknown: it may have been applied."""


class ReplicationUnconfirmed(RedisUnavailable):
    """The primary applied the write but fewer replicas than asked acknowledged it in time
    (``WAIT``): a failover may still lose it, so its outcome is as unknown as a timed-out call's."""

    def __init__(self, message: str, acked: int, wanted: int) -> None:
        super().__init__(message)
        self.acked = acked
        self.wanted = wanted


@attrs.frozen
class Acquired:
    """This node now holds the lease under ``token``."""

    token: int
    previous_node: str | None
    previous_token: int | None
    takeover_ms: int | None  # how long the job was leaderless (None: first leader ever)
    cursor: str | None  # the last committed paging token
    # Redis's token counter when it was below the caller's known token (Redis went back in time,
    # e.g. a failover to a replica that missed writes); None when it was not.
    rolled_back_from: int | None = None
    # The primary's replication id (changes when a replica is promoted); not part of equality.
    replid: str | None = attrs.field(default=None, eq=False)


@attrs.frozen
class Held:
    """Someone holds the lease; it has ``ttl_left_ms`` to live unless renewed."""

    holder: str
    token: int
    ttl_left_ms: int
    replid: str | None = attrs.field(default=None, eq=False)


@attrs.frozen
class StateLost:
    """Redis's token counter is below a token the caller has seen *and* the job's cursor is gone:
    Redis lost the job's state (restarted empty, an empty replica promoted). Nothing was issued:
    leading would restart the job from its start cursor, which is an operator's decision."""

    counter: int
    cursor: str | None
    replid: str | None = attrs.field(default=None, eq=False)


@attrs.frozen
class Committed:
    token: int
    cursor: str
    count: int
    trimmed: int = 0  # events-stream entries the commit's retention trim removed (events_max_len)


@attrs.frozen
class CommitRejected:
    """Redis refused the commit and changed nothing.

    ``reason`` is one of ``stale-token``, ``lease-lost``, ``cursor-moved``, ``not-after-cursor``,
    ``bad-paging-token``; ``current_token`` is the job's token counter when Redis checked.
    """

    token: int
    reason: str
    current_token: int
    stored_cursor: str | None


@attrs.frozen
class LeaderInfo:
    node: str | None
    token: int | None
    lease_ttl_ms_left: int | None


@attrs.frozen
class JobState:
    """A read-only snapshot for ``inspect`` and the tests."""

    job: str
    leader: str | None
    token: int
    lease_ttl_ms_left: int | None
    cursor: str | None
    cursor_token: int | None
    events: int
    audit: list[dict[str, str]]


@attrs.frozen
class GroupInfo:
    """One consumer group on the events stream."""

    name: str
    consumers: int
    pending: int  # delivered to a consumer, not yet acknowledged
    lag: int | None  # entries not yet delivered to the group (None: Redis cannot tell)
    last_delivered_id: str

    @property
    def unacknowledged(self) -> int | None:
        """Entries the group has still to acknowledge: pending plus undelivered."""
        return None if self.lag is None else self.pending + self.lag


@attrs.frozen
class StreamInfo:
    """The events stream as its readers see it (for metrics, ``inspect`` and the tests)."""

    length: int
    entries_added: int  # every entry ever appended, trimmed ones included
    first_id: str | None
    last_id: str | None
    groups: tuple[GroupInfo, ...]

    @property
    def trimmed(self) -> int:
        """Entries removed by retention (the stream is only ever trimmed from its head)."""
        return self.entries_added - self.length


def job_keys(job: str) -> dict[str, str]:
    """The Redis keys of one job; the ``{job}`` hash tag keeps them in one cluster slot."""
    prefix = f"ingestion:{{{job}}}"
    return {
        name: f"{prefix}:{name}"
        for name in ("lease", "token", "cursor", "events", "audit", "leader", "released", "health")
    }


def parse_lease_value(value: str) -> tuple[int, str]:
    token, _, node = value.partition("|")
    return int(token), node


SENTINEL_SCHEMES = ("redis+sentinel", "rediss+sentinel")


@attrs.frozen
class SentinelTarget:
    """A parsed ``redis+sentinel://[user:pass@]H:P[,H:P...]/SERVICE[/DB]`` URL."""

    sentinels: tuple[tuple[str, int], ...]
    service: str
    db: int
    username: str | None
    password: str | None
    tls: bool

    @property
    def addresses(self) -> str:
        """``H:P,H:P``: the sentinels, for logs (no credentials)."""
        return ",".join(f"{h}:{p}" for h, p in self.sentinels)


class BadRedisUrl(ValueError):
    """A Redis URL that cannot name a server; the message says what is wrong."""


def is_sentinel_url(url: str) -> bool:
    return url.partition("://")[0].lower() in SENTINEL_SCHEMES


def _credentials(userinfo: str) -> tuple[str | None, str | None]:
    """(username, password) of a URL's ``user:pass`` part (empty: neither)."""
    if not userinfo:
        return None, None
    user, colon, secret = userinfo.partition(":")
    if not colon:  # redis://secret@host: a bare word is the password (as redis-py reads it)
        return None, unquote(user) or None
    return unquote(user) or None, unquote(secret)


def _addresses(hosts: str, default_port: int, what: str) -> list[tuple[str, int]]:
    """``H:P[,H:P...]`` as (host, port) pairs (a missing port is ``default_port``).

    Raises:
        BadRedisUrl: an address that is not HOST:PORT.
    """
    out: list[tuple[str, int]] = []
    for part in (p.strip() for p in hosts.split(",")):
        if not part:
            continue
        host, colon, port_text = part.rpartition(":")
        if not colon:
            host, port_text = part, str(default_port)
        host = host.strip("[]")
        if not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
            raise BadRedisUrl(f"{what} address {part!r} is not HOST:PORT")
        out.append((host, int(port_text)))
    return out


def parse_sentinel_url(url: str) -> SentinelTarget:
    """Parse a Sentinel URL.

    Raises:
        BadRedisUrl: no sentinel, no service, a bad port or database number.
    """
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.lower() not in SENTINEL_SCHEMES:
        raise BadRedisUrl("a Sentinel URL starts with redis+sentinel:// or rediss+sentinel://")
    netloc, _, path = rest.partition("/")
    userinfo, _, hosts = netloc.rpartition("@")
    username, password = _credentials(userinfo)
    sentinels = _addresses(hosts, 26379, "sentinel")
    if not sentinels:
        raise BadRedisUrl("names no sentinel (expected redis+sentinel://HOST:PORT[,HOST:PORT...]/SERVICE)")
    segments = [seg for seg in path.split("?")[0].split("/") if seg]
    if not segments:
        raise BadRedisUrl("names no service (expected .../SERVICE[/DB] after the sentinel addresses)")
    if len(segments) > 2 or (len(segments) == 2 and not segments[1].isdigit()):
        raise BadRedisUrl(f"path {path!r} is not SERVICE[/DB]")
    return SentinelTarget(
        sentinels=tuple(sentinels),
        service=unquote(segments[0]),
        db=int(segments[1]) if len(segments) == 2 else 0,
        username=username,
        password=password,
        tls=scheme.lower() == "rediss+sentinel",
    )


CLUSTER_SCHEMES = ("redis+cluster", "rediss+cluster")


@attrs.frozen
class ClusterTarget:
    """A parsed ``redis+cluster://[user:pass@]H:P[,H:P...]`` URL (the seed nodes)."""

    nodes: tuple[tuple[str, int], ...]
    username: str | None
    password: str | None = attrs.field(repr=False)
    tls: bool

    @property
    def addresses(self) -> str:
        return ",".join(f"{h}:{p}" for h, p in self.nodes)


def is_cluster_url(url: str) -> bool:
    return url.partition("://")[0].lower() in CLUSTER_SCHEMES


def parse_cluster_url(url: str) -> ClusterTarget:
    """Parse a Redis Cluster URL.

    Raises:
        BadRedisUrl: no node, or a bad address or path.
    """
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.lower() not in CLUSTER_SCHEMES:
        raise BadRedisUrl("a Redis Cluster URL starts with redis+cluster:// or rediss+cluster://")
    netloc, _, path = rest.partition("/")
    userinfo, _, hosts = netloc.rpartition("@")
    username, password = _credentials(userinfo)
    nodes = _addresses(hosts, 6379, "cluster node")
    if not nodes:
        raise BadRedisUrl("names no node (expected redis+cluster://HOST:PORT[,HOST:PORT...])")
    if path.split("?")[0].strip("/") not in ("", "0"):
        raise BadRedisUrl(f"path {path!r}: a Redis Cluster has only database 0")
    return ClusterTarget(tuple(nodes), username, password, scheme.lower() == "rediss+cluster")


def _client_kwargs(client: Any) -> dict[str, Any]:
    """The connection settings of a client (a plain, Sentinel or cluster client)."""
    pool = getattr(client, "connection_pool", None)
    if pool is not None:
        return dict(pool.connection_kwargs)
    manager = getattr(client, "nodes_manager", None)
    return dict(getattr(manager, "connection_kwargs", {}) or {})


def connect(
    url: str,
    *,
    timeout: float,
    connect_timeout: float | None = None,
    tls_ca_file: str | None = None,
    tls_cert_file: str | None = None,
    tls_key_file: str | None = None,
) -> redis.Redis:
    """A redis-py client whose every call is bounded by ``timeout`` and never retried.

    ``redis://`` and ``rediss://`` URLs may carry ``user:password@`` (an ACL user) or ``:password@``
    (``requirepass``). For ``rediss://`` the server certificate is verified against ``tls_ca_file``
    (else the system store); ``tls_cert_file``/``tls_key_file`` are the client certificate for a
    server that sets ``tls-auth-clients``.

    ``redis+sentinel://`` (``rediss+sentinel://``) URLs give a client of the service's current
    primary (redis-py's ``Sentinel.master_for``): each new connection asks the sentinels where the
    primary is, and a ``READONLY`` answer from a demoted primary drops the connection so the next
    call finds the new one. The URL's credentials are the Redis servers'; the sentinels are reached
    without (and over TLS too with ``rediss+sentinel://``).
    """
    tls: dict[str, Any] = {}
    if url.startswith(("rediss://", "rediss+sentinel://", "rediss+cluster://")):
        tls["ssl_cert_reqs"] = "required"
        if tls_ca_file:
            tls["ssl_ca_certs"] = tls_ca_file
        if tls_cert_file:
            tls["ssl_certfile"] = tls_cert_file
        if tls_key_file:
            tls["ssl_keyfile"] = tls_key_file
    common: dict[str, Any] = {
        "socket_timeout": timeout,
        "socket_connect_timeout": connect_timeout if connect_timeout is not None else timeout,
        "retry": Retry(NoBackoff(), 0),
        "health_check_interval": 0,
    }
    if is_cluster_url(url):
        ctarget = parse_cluster_url(url)
        if ctarget.tls:
            tls["ssl"] = True
        cluster = RedisCluster(
            startup_nodes=[ClusterNode(h, p) for h, p in ctarget.nodes],
            username=ctarget.username,
            password=ctarget.password,
            decode_responses=True,
            # Slots a failed master served answer nothing until its replica takes over; the
            # other jobs' slots keep working meanwhile.
            require_full_coverage=False,
            **common,
            **tls,
        )
        cluster.cluster_target = ctarget  # type: ignore[attr-defined]
        return cluster  # type: ignore[return-value]
    if is_sentinel_url(url):
        target = parse_sentinel_url(url)
        if target.tls:
            tls["ssl"] = True
        sentinel = Sentinel(
            list(target.sentinels),
            sentinel_kwargs={**common, "decode_responses": True, **tls},
        )
        client = sentinel.master_for(
            target.service,
            redis_class=redis.Redis,
            db=target.db,
            username=target.username,
            password=target.password,
            decode_responses=True,
            **common,
            **tls,
        )
        client.sentinel_target = target  # type: ignore[attr-defined]
        return client
    return redis.Redis.from_url(url, decode_responses=True, **common, **tls)


def sentinel_services(target: SentinelTarget, timeout: float) -> tuple[list[str], dict[str, list[str]]]:
    """Ask every sentinel which services it monitors: (unreachable addresses, {address: services}).

    For start-up checks: a service that no answering sentinel knows is a configuration error,
    while no answer at all is an outage to wait out.
    """
    unreachable: list[str] = []
    known: dict[str, list[str]] = {}
    for host, port in target.sentinels:
        client = redis.Redis(
            host=host, port=port, socket_timeout=timeout, socket_connect_timeout=timeout,
            retry=Retry(NoBackoff(), 0), decode_responses=True, ssl=target.tls,
        )  # fmt: skip
        try:
            masters: Any = client.sentinel_masters()
            known[f"{host}:{port}"] = sorted(masters)
        except (redis.RedisError, OSError):
            unreachable.append(f"{host}:{port}")
        finally:
            client.close()
    return unreachable, known


def _chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in seen:
        seen.append(current)
        current = current.__cause__ or current.__context__
    return seen


def classify_redis_error(exc: BaseException) -> str:
    """What went wrong, in an operator's words: ``authentication failed``, ``TLS handshake
    failed``, ``connection refused``, ``timed out``, ..."""
    chain = _chain(exc)
    text = " ".join(str(e) for e in chain)
    if any(isinstance(e, MasterNotFoundError) for e in chain):
        return "no sentinel named a primary for the service (sentinels unreachable, or the primary down)"
    if "NOREPLICAS" in text:
        return "the primary refused the write: not enough replicas (min-replicas-to-write)"
    if "READONLY" in text or "now a slave" in text:
        return "the server is a replica now (a failover): reconnecting to the new primary"
    if (
        any(isinstance(e, redis.AuthenticationError) for e in chain)
        or "WRONGPASS" in text
        or "invalid username-password pair" in text
    ):
        return "authentication failed (check the user and password in redis.url)"
    if any(isinstance(e, redis.exceptions.NoPermissionError) for e in chain) or "NOPERM" in text:
        return "permission denied by the Redis ACL (the user needs the ingestion:* keys and scripting)"
    if any(isinstance(e, ssl.SSLError) for e in chain) or "SSL" in text:
        return "TLS handshake failed (check rediss://, redis.tls_ca_file and the server certificate)"
    if any(isinstance(e, ConnectionRefusedError) for e in chain) or "refused" in text.lower():
        return "connection refused"
    if any(isinstance(e, redis.TimeoutError | TimeoutError) for e in chain):
        return "timed out"
    if any(isinstance(e, ConnectionResetError) for e in chain) or any(
        phrase in text.lower() for phrase in ("closed by server", "reset by peer")
    ):
        return "connection closed by the server (a TLS port needs rediss://)"
    return "unavailable"


def describe_redis_error(exc: BaseException, *, where: str, secret: str | None = None) -> str:
    """One line naming the setting, what went wrong, and redis-py's text with any password blanked."""
    detail = f"{type(exc).__name__}: {exc}"
    if secret:
        detail = detail.replace(secret, "***")
    return f"redis.url {where}: {classify_redis_error(exc)}: {detail}"


def _endpoint(client: redis.Redis) -> tuple[str, str | None]:
    """(``scheme://[user@]host:port/db`` without the password, the password) of a client."""
    ctarget: ClusterTarget | None = getattr(client, "cluster_target", None)
    if ctarget is not None:
        scheme = "rediss+cluster" if ctarget.tls else "redis+cluster"
        user = f"{ctarget.username}@" if ctarget.username else ""
        return f"{scheme}://{user}{ctarget.addresses}", ctarget.password
    kw = client.connection_pool.connection_kwargs
    tls = issubclass(client.connection_pool.connection_class, redis.SSLConnection)
    target: SentinelTarget | None = getattr(client, "sentinel_target", None)
    if target is not None:
        scheme = "rediss+sentinel" if target.tls else "redis+sentinel"
        user = f"{target.username}@" if target.username else ""
        return f"{scheme}://{user}{target.addresses}/{target.service}/{target.db}", target.password
    if "path" in kw:
        return f"unix://{kw['path']}", kw.get("password")
    user = f"{kw['username']}@" if kw.get("username") else ""
    scheme = "rediss" if tls else "redis"
    where = f"{scheme}://{user}{kw.get('host')}:{kw.get('port')}/{kw.get('db', 0)}"
    return where, kw.get("password")


class LeaseStore:
    """Lease, fencing-token and cursor operations for one job, each one atomic in Redis."""

    def __init__(
        self,
        client: redis.Redis,
        job: str,
        call_timeout: float | None = None,
        *,
        min_replicas_acked: int = 0,
        replication_wait: float | None = None,
        events_max_len: int = 0,
    ) -> None:
        self.client = client
        self.job = job
        # Every call, whole, is bounded by this (default: the client's socket timeout).
        self.call_timeout = call_timeout or _client_kwargs(client).get("socket_timeout") or 1.0
        # After each acquire and commit, wait (WAIT, same connection) for this many replicas to
        # acknowledge it, at most ``replication_wait`` seconds (default: half the call bound, so
        # the script and the WAIT fit in one bounded call).
        self.min_replicas_acked = min_replicas_acked
        self.replication_wait_ms = max(
            1, round(1000 * (replication_wait if replication_wait is not None else self.call_timeout / 2))
        )
        # Keep about this many entries in the events stream (0: all), never one that a consumer
        # group still needs: trimmed inside the commit script, under the same fencing check.
        self.events_max_len = events_max_len
        self.keys = job_keys(job)
        self._stale_topology = False
        self._where, self._secret = _endpoint(client)
        self._acquire = client.register_script(_LUA_HELPERS + _ACQUIRE)
        self._renew = client.register_script(_LUA_HELPERS + _RENEW)
        self._release = client.register_script(_LUA_HELPERS + _RELEASE)
        self._commit = client.register_script(_LUA_HELPERS + _COMMIT)
        self._fenced_hset = client.register_script(_LUA_HELPERS + _FENCED_HSET)
        self._report_health = client.register_script(_LUA_HELPERS + _REPORT_HEALTH)
        self._fenced_audit = client.register_script(_LUA_HELPERS + _FENCED_AUDIT)

    async def follow_primary(self, every: float = FOLLOW_PRIMARY_EVERY) -> None:
        """With Sentinel, ask where the primary is every ``every`` seconds, until cancelled.

        redis-py asks the sentinels only when it opens a connection, and drops idle connections
        to a former primary only then; a pooled connection to an old primary that was not told
        to step down (a planned failover leaves it a writable primary for seconds) would keep
        taking our writes there. Asking often makes the pool drop them within ``every``. This
        runs beside the calls, never in their path: sentinels that are slow or gone must not
        delay or fail a call to a primary that works. Errors are left to the calls to report.
        """
        pool = getattr(self.client, "connection_pool", None)
        if not isinstance(pool, SentinelConnectionPool):
            return
        while True:
            with trio.move_on_after(max(every, 4 * self.call_timeout)):
                try:
                    # disconnects idle connections when the primary moved
                    await trio.to_thread.run_sync(pool.get_master_address, abandon_on_cancel=True)
                except (redis.RedisError, OSError):
                    pass
            await trio.sleep(every)

    async def _call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        # The socket timeouts bound each read, write and connect, not the whole call (a fresh
        # connection may handshake, and a script may need loading); this bounds the whole call.
        # An abandoned worker finishes on its own; its connection is not reused before it does.
        try:
            with trio.fail_after(self.call_timeout):
                return await trio.to_thread.run_sync(
                    functools.partial(self._fresh_then, fn, *args, **kwargs), abandon_on_cancel=True
                )
        except trio.TooSlowError as exc:
            self._stale_topology = True
            raise RedisUnavailable(
                f"{self._where}: timed out: no answer within {self.call_timeout * 1000:.0f} ms"
            ) from exc
        except (redis.RedisError, OSError) as exc:
            if isinstance(exc, redis.ConnectionError | redis.TimeoutError | OSError):
                self._stale_topology = True  # (a cluster re-reads its slot map before the next call)
            raise RedisUnavailable(
                describe_redis_error(exc, where=self._where, secret=self._secret)
            ) from exc

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """A blocking redis-py call of the caller's, bounded and reported like every store call.

        Raises:
            RedisUnavailable: it failed or timed out (its effect is unknown).
        """
        return await self._call(fn, *args)

    def _script_then_wait(
        self, script: Any, keys: list[str], args: list[Any], *, replid: bool = False
    ) -> tuple[Any, int | None, str | None]:
        """Run ``script`` and, on the same connection right after it, ``WAIT`` for the replicas
        (when asked for) and ``INFO replication`` (when ``replid``): one round trip, in a worker
        thread. Returns (the script's answer, replicas that acknowledged or None, the replid)."""
        for attempt in (1, 2):
            conn = self._connection_for(keys[0])
            pipe = conn.pipeline(transaction=False)
            pipe.evalsha(script.sha, len(keys), *keys, *args)
            if self.min_replicas_acked:
                pipe.execute_command("WAIT", self.min_replicas_acked, self.replication_wait_ms)
            if replid:
                pipe.info("replication")
            out = pipe.execute(raise_on_error=False)
            if isinstance(out[0], redis.exceptions.NoScriptError) and attempt == 1:
                # A primary that never saw the script (a fresh or newly promoted one): NOSCRIPT
                # means nothing ran, so loading it and running again is safe.
                conn.script_load(script.script)
                continue
            if isinstance(out[0], redis.exceptions.AskError | redis.exceptions.MovedError):
                # Cluster: the job's slot is served elsewhere now (a failover, a resharding);
                # nothing ran here. Re-read the slot map, and run again once.
                self._stale_topology = True
                if attempt == 1:
                    continue
            for item in out:
                if isinstance(item, Exception):
                    raise item
            acked = int(out[1]) if self.min_replicas_acked else None
            info = out[-1] if replid else None
            return out[0], acked, (info or {}).get("master_replid") if info is not None else None
        raise AssertionError("unreachable")

    def _fresh_then(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run ``fn``; on a cluster whose slot map may be stale (a failed call), re-read it first."""
        if self._stale_topology and isinstance(self.client, RedisCluster):
            self._stale_topology = False
            self.client.nodes_manager.initialize()
        return fn(*args, **kwargs)

    def _connection_for(self, key: str) -> redis.Redis:
        """The client that talks to the server holding ``key``: on a cluster, the master of the
        key's slot (so that a script, ``WAIT`` and ``INFO`` share one connection)."""
        if not isinstance(self.client, RedisCluster):
            return self.client
        if self._stale_topology:
            self._stale_topology = False
            self.client.nodes_manager.initialize()
        node = self.client.get_node_from_key(key)
        conn: redis.Redis = self.client.get_redis_connection(node)
        return conn

    def _check_acked(self, what: str, acked: int | None) -> None:
        if acked is not None and acked < self.min_replicas_acked:
            raise ReplicationUnconfirmed(
                f"{self._where}: {what} applied by the primary but acknowledged by {acked} of the "
                f"{self.min_replicas_acked} replicas asked for within {self.replication_wait_ms} ms "
                "(redis.min_replicas_acked): a failover may lose it",
                acked,
                self.min_replicas_acked,
            )

    async def acquire(self, node: str, ttl_ms: int, known_token: int = 0) -> Acquired | Held | StateLost:
        """Take the lease if it is free. ``known_token``: the highest fencing token the caller has
        seen. If Redis's counter is below it (Redis went back in time) the new token is floored
        above it and ``rolled_back_from`` says so; if the job's cursor is gone as well, Redis lost
        the job and nothing is issued (:class:`StateLost`).

        Raises:
            RedisUnavailable: the outcome is unknown (a lease may have been granted);
                :class:`ReplicationUnconfirmed` when granted but not replicated as asked.
        """
        k = self.keys
        res, acked, replid = await self._call(
            self._script_then_wait,
            self._acquire,
            [k["lease"], k["token"], k["leader"], k["audit"], k["cursor"]],
            [node, ttl_ms, AUDIT_MAXLEN, known_token],
            replid=True,
        )
        if int(res[0]) == 2:
            return StateLost(counter=int(res[1]), cursor=res[2] or None, replid=replid)
        if int(res[0]) == 0:
            token, holder = parse_lease_value(res[1])
            return Held(holder=holder, token=token, ttl_left_ms=int(res[2]), replid=replid)
        self._check_acked("the lease grant", acked)
        _, token, prev_node, prev_token, takeover, cursor, rolled_back = res
        return Acquired(
            token=int(token),
            previous_node=prev_node or None,
            previous_token=int(prev_token) if prev_token else None,
            takeover_ms=int(takeover) if takeover != "" else None,
            cursor=cursor or None,
            rolled_back_from=int(rolled_back) if rolled_back != "" else None,
            replid=replid,
        )

    async def renew(self, node: str, token: int, ttl_ms: int) -> bool:
        """Extend the lease if it still holds exactly ``node`` and ``token``; False if lost."""
        k = self.keys
        res = await self._call(self._renew, keys=[k["lease"], k["leader"]], args=[node, token, ttl_ms])
        return bool(int(res))

    async def release(self, node: str, token: int) -> bool:
        """Give the lease up (if still ours) and wake the standbys; False if it was not ours."""
        k = self.keys
        res = await self._call(
            self._release,
            keys=[k["lease"], k["leader"], k["audit"]],
            args=[node, token, k["released"], AUDIT_MAXLEN],
        )
        return bool(int(res))

    async def commit(
        self,
        node: str,
        token: int,
        previous_cursor: str | None,
        records: Sequence[Record],
        anchor: str | None = None,
    ) -> Committed | CommitRejected:
        """Append ``records`` to the events stream and advance the cursor, fenced by ``token``.

        ``previous_cursor`` is the cursor the writer believes is committed; a commit that does not
        continue exactly from it is rejected, so a batch can neither be replayed nor leave a gap.
        ``anchor`` (a paging token after the stored cursor and the last record) then becomes the
        cursor: alone, it pins a position; after records, it is where the source read through.

        Raises:
            ValueError: a record's paging token is malformed or the batch is out of order.
            RedisUnavailable: the outcome is unknown; re-read the cursor before going on
                (:class:`ReplicationUnconfirmed`: applied by the primary, not replicated as asked).
        """
        if not records and anchor is None:
            raise ValueError("a commit carries records, an anchor cursor, or both")
        previous = None
        for token_text in [r.paging_token for r in records] + ([anchor] if anchor is not None else []):
            key = token_key(token_text)
            if previous is not None and key <= previous:
                raise ValueError(f"batch out of order at paging token {token_text!r}")
            previous = key
        args: list[str | int] = [
            node, token, previous_cursor or "", anchor or "", self.events_max_len
        ]
        for r in records:
            args.append(r.paging_token)
            args.append(r.body)
        k = self.keys
        res, acked, _ = await self._call(
            self._script_then_wait, self._commit, [k["token"], k["lease"], k["cursor"], k["events"]], args
        )
        if int(res[0]) == 1:
            self._check_acked("the commit", acked)
            return Committed(token=token, count=int(res[1]), cursor=res[2], trimmed=int(res[3]))
        return CommitRejected(
            token=token, reason=res[1], current_token=int(res[2]), stored_cursor=res[3] or None
        )

    async def fenced_hset(
        self, node: str, token: int, key: str, mapping: dict[str, str]
    ) -> CommitRejected | None:
        """Set fields of the hash ``key`` only if ``token`` is current and ``node`` holds the lease.

        For singleton jobs' own side effects (beyond the events stream): returns None when applied,
        else the rejection. ``key`` should carry the job's hash tag (``job_keys``) on a cluster.

        Raises:
            RedisUnavailable: the outcome is unknown.
        """
        args: list[str | int] = [node, token]
        for field, value in mapping.items():
            args += [field, value]
        k = self.keys
        res = await self._call(self._fenced_hset, keys=[k["token"], k["lease"], key], args=args)
        if int(res[0]) == 1:
            return None
        return CommitRejected(token=token, reason=res[1], current_token=int(res[2]), stored_cursor=None)

    async def report_health(self, node: str, age_ms: int | None, window_ms: int) -> list[str]:
        """Record that ``node``'s source answered ``age_ms`` ago (None: it does not answer now);
        returns the nodes whose source answered within ``window_ms`` (Redis time).

        Raises:
            RedisUnavailable: failed or timed out.
        """
        k = self.keys["health"]
        args = [node, "" if age_ms is None else max(0, age_ms), window_ms]
        healthy: list[str] = await self._call(self._report_health, keys=[k], args=args)
        return healthy

    async def source_health(self) -> dict[str, int]:
        """node -> Redis time (ms) of its source's last successful answer."""
        raw: dict[str, str] = await self._call(self.client.hgetall, self.keys["health"])  # type: ignore[arg-type]
        return {node: int(ms) for node, ms in raw.items()}
    async def fenced_audit(
        self, node: str, token: int, event: str, fields: dict[str, str]
    ) -> CommitRejected | None:
        """Append ``event`` (with ``node``, ``token`` and ``fields``) to the job's audit stream,
        only if ``token`` is current and ``node`` holds the lease: a job's own record of something
        that happened in its term (a skipped history gap). None when written, else the rejection.

        Raises:
            RedisUnavailable: the outcome is unknown.
        """
        args: list[str | int] = [node, token, AUDIT_MAXLEN, event]
        for field, value in fields.items():
            args += [field, value]
        k = self.keys
        res = await self._call(self._fenced_audit, keys=[k["token"], k["lease"], k["audit"]], args=args)
        if int(res[0]) == 1:
            return None
        return CommitRejected(token=token, reason=res[1], current_token=int(res[2]), stored_cursor=None)

    async def committed_cursor(self) -> str | None:
        cursor: str | None = await self._call(self.client.hget, self.keys["cursor"], "cursor")  # type: ignore[arg-type]
        return cursor

    async def leader(self) -> LeaderInfo:
        def read() -> LeaderInfo:
            pipe = self.client.pipeline(transaction=False)
            pipe.get(self.keys["lease"])
            pipe.pttl(self.keys["lease"])
            value, ttl = pipe.execute()
            if value is None:
                return LeaderInfo(None, None, None)
            token, node = parse_lease_value(value)
            return LeaderInfo(node, token, int(ttl) if int(ttl) >= 0 else None)

        return await self._call(read)

    async def state(self, audit_count: int = 10) -> JobState:
        k = self.keys

        def read() -> JobState:
            pipe = self.client.pipeline(transaction=False)
            pipe.get(k["lease"])
            pipe.pttl(k["lease"])
            pipe.get(k["token"])
            pipe.hgetall(k["cursor"])
            pipe.xlen(k["events"])
            pipe.xrevrange(k["audit"], count=audit_count)
            lease, ttl, token, cursor, events, audit = pipe.execute()
            leader = parse_lease_value(lease)[1] if lease else None
            return JobState(
                job=self.job,
                leader=leader,
                token=int(token or 0),
                lease_ttl_ms_left=int(ttl) if lease and int(ttl) >= 0 else None,
                cursor=cursor.get("cursor"),
                cursor_token=int(cursor["token"]) if "token" in cursor else None,
                events=int(events),
                audit=[{"id": entry_id, **fields} for entry_id, fields in reversed(audit)],
            )

        return await self._call(read)

    async def events_info(self) -> StreamInfo:
        """Length, trimmed entries and consumer groups of the events stream (read-only)."""
        key = self.keys["events"]

        def read() -> StreamInfo:
            try:
                info: Any = self.client.xinfo_stream(key)
            except redis.ResponseError as exc:
                if "no such key" in str(exc).lower():
                    return StreamInfo(0, 0, None, None, ())
                raise
            groups: Any = self.client.xinfo_groups(key)
            first, last = info.get("first-entry"), info.get("last-entry")
            return StreamInfo(
                length=int(info["length"]),
                # Redis 7.0 counts appended entries; before it, assume nothing was trimmed
                entries_added=int(info.get("entries-added", info["length"])),
                first_id=first[0] if first else None,
                last_id=last[0] if last else None,
                groups=tuple(
                    GroupInfo(
                        name=g["name"],
                        consumers=int(g["consumers"]),
                        pending=int(g["pending"]),
                        lag=int(g["lag"]) if g.get("lag") is not None else None,
                        last_delivered_id=g["last-delivered-id"],
                    )
                    for g in groups
                ),
            )

        return await self._call(read)

    def release_notices(self) -> ReleaseNotices:
        return ReleaseNotices(self)


class NodeRegistry:
    """The live nodes of the cluster: each heartbeats into one sorted set, scored with Redis's
    clock (so the nodes' clocks do not matter). Used only for balancing, never for safety."""

    def __init__(self, client: redis.Redis, call_timeout: float | None = None, key: str = NODE_REGISTRY_KEY):
        self.key = key
        self._store = LeaseStore(client, "-", call_timeout)  # for its bounded calls
        self._heartbeat = client.register_script(_LUA_HELPERS + _NODE_HEARTBEAT)

    async def heartbeat(self, node: str, live_ms: int) -> list[str]:
        """Record ``node`` as live now; the nodes that heartbeat within ``live_ms``.

        Raises:
            RedisUnavailable: failed or timed out.
        """
        live: list[str] = await self._store.run(
            functools.partial(self._heartbeat, keys=[self.key], args=[node, live_ms, NODE_FORGET_MS])
        )
        return live

    async def leave(self, node: str) -> None:
        """Remove ``node`` (a node shutting down): the others count it out at once."""
        await self._store.run(self._store.client.zrem, self.key, node)


class ReleaseNotices:
    """A subscription to the job's release channel, for standbys that must react at once.

    ``wait(seconds)`` returns the releasing holder's node id when a release notice arrived within
    that many seconds, else None. Connection trouble is reported as None after the wait (the
    caller campaigns anyway, so a lost notice costs at most one standby interval). The subscription
    is renewed every ``RESUBSCRIBE_EVERY`` waits, so a half-open connection (a partition that sent
    no reset) cannot silence notices for longer than that. One waiter at a time; the pub/sub
    connection is only ever touched by the worker thread of the current wait (``close`` from the
    trio side defers to that thread when one is still running, e.g. after a cancelled wait).
    """

    RESUBSCRIBE_EVERY = 30

    def __init__(self, store: LeaseStore) -> None:
        self._store = store
        self._pubsub: Any = None
        self._waits = 0
        self._lock = threading.Lock()
        self._busy = False
        self._closed = False

    def _wait(self, seconds: float) -> str | None:
        with self._lock:
            if self._closed:
                return None
            self._busy = True
        end = time.monotonic() + seconds
        try:
            if (
                self._pubsub is None
                or self._waits >= self.RESUBSCRIBE_EVERY
                or self._on_former_primary()
            ):
                # Subscribe the new connection first, then read what the old one still holds,
                # then close it: a notice published in between reaches one or the other.
                fresh = self._store.client.pubsub(ignore_subscribe_messages=True)
                fresh.subscribe(self._store.keys["released"])
                old, self._pubsub = self._pubsub, fresh
                self._waits = 0
                held = self._drain(old)
                if held is not None:
                    return held
            self._waits += 1
            while (left := end - time.monotonic()) > 0:
                msg = self._pubsub.get_message(timeout=left)
                if msg is not None and msg.get("type") == "message":
                    return str(msg.get("data", "")).partition("|")[2]
        except (redis.RedisError, OSError):
            self._reset()
            left = end - time.monotonic()
            if left > 0:
                time.sleep(left)
        finally:
            with self._lock:
                self._busy = False
                if self._closed:
                    self._reset()
        return None

    def _on_former_primary(self) -> bool:
        """With Sentinel: the subscription is on a server that is no longer the primary (whose
        address ``LeaseStore.follow_primary`` re-reads), where no notice comes."""
        pool = getattr(self._store.client, "connection_pool", None)
        conn = getattr(self._pubsub, "connection", None)
        if not isinstance(pool, SentinelConnectionPool) or conn is None or not pool.master_address:
            return False
        return (conn.host, conn.port) != tuple(pool.master_address)

    @staticmethod
    def _drain(old: Any) -> str | None:
        """The first notice an old subscription still holds (then close it), else None."""
        if old is None:
            return None
        found = None
        try:
            while found is None:
                msg = old.get_message(timeout=0)
                if msg is None:
                    break
                if msg.get("type") == "message":
                    found = str(msg.get("data", "")).partition("|")[2]
        except (redis.RedisError, OSError):
            pass
        try:
            old.close()
        except (redis.RedisError, OSError):
            pass
        return found

    async def wait(self, seconds: float) -> str | None:
        return await trio.to_thread.run_sync(self._wait, seconds, abandon_on_cancel=True)

    def _reset(self) -> None:
        if self._pubsub is not None:
            try:
                self._pubsub.close()
            except (redis.RedisError, OSError):
                pass
            self._pubsub = None
        self._waits = 0

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self._busy:
                return  # the running worker closes it when it returns
        self._reset()
