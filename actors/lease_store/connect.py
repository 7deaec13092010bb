"""Reaching Redis: the URL forms (plain, TLS, Sentinel, Cluster), the bounded never-retrying
client, and what a failure means in an operator's words."""

from __future__ import annotations

import socket
import ssl
from typing import Any
from urllib.parse import unquote, urlsplit

import attrs
import redis
from redis.backoff import NoBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.exceptions import RedisClusterException
from redis.retry import Retry
from redis.sentinel import MasterNotFoundError, Sentinel

from actors.lease_store.keys import KEY_PATTERN

SENTINEL_SCHEMES = ("redis+sentinel", "rediss+sentinel")
# The client's pool bound. redis-py 8 bounds it at 100 by default, and a node holds a connection
# per standby job (its release-notice subscription) beside those its calls use (bounded by their
# threads): 200 jobs starting on a node took all 100, and its renewals then failed with
# ``MaxConnectionsError``. The bound that matters is the server's ``maxclients`` (10,000).
MAX_CONNECTIONS = 10_000


class ClusterUnreachable(redis.ConnectionError):
    """No node of a cluster URL answered while the client was built (redis-py reads the slot map
    then): an outage, like a plain Redis that does not answer."""


@attrs.frozen
class SentinelTarget:
    """A parsed ``redis+sentinel://[user:pass@]H:P[,H:P...]/SERVICE[/DB]`` URL."""

    sentinels: tuple[tuple[str, int], ...]
    service: str
    db: int
    username: str | None
    password: str | None = attrs.field(repr=False)
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


def client_kwargs(client: Any) -> dict[str, Any]:
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
        "max_connections": MAX_CONNECTIONS,
    }
    if is_cluster_url(url):
        ctarget = parse_cluster_url(url)
        if ctarget.tls:
            tls["ssl"] = True
        try:
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
        except RedisClusterException as exc:
            # redis-py reads the slot map when the client is built: no node answering is an
            # outage (the caller waits for one), not a mistake.
            if isinstance(exc.__cause__, redis.ConnectionError | redis.TimeoutError | OSError):
                raise ClusterUnreachable(str(exc)) from exc
            raise
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
        return f"permission denied by the Redis ACL (the user needs the {KEY_PATTERN} keys and scripting)"
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


def redacted_endpoint(client: redis.Redis) -> tuple[str, str | None]:
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



def _resp_probe(host: str, port: int, timeout: float) -> str | None:
    """What answers at ``host:port`` when it is not Redis: a short description, or None when it
    speaks RESP (or cannot be reached: an outage)."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.settimeout(timeout)
            sock.sendall(b"PING\r\n\r\n")  # Redis ignores the empty line; HTTP sees a request end
            first = sock.recv(64)
    except OSError:
        return None
    if first[:1] in (b"+", b"-", b":", b"$", b"*", b"_", b",", b"#", b"%", b"~", b">", b"|", b"!", b"="):
        return None
    if not first or first[:1] == b"\x15":
        return None  # closed, or a TLS alert: the TLS-port case, reported as an outage with its hint
    if first.startswith((b"HTTP/", b"<")):
        return f"an HTTP server answers at {host}:{port}, not Redis: check the host and port in redis.url"
    return (
        f"the server at {host}:{port} does not speak the Redis protocol (it answered "
        f"{first[:20]!r}): check the host and port in redis.url"
    )


@attrs.frozen
class RedisDiagnosis:
    """What :func:`examine_redis` found."""

    reached: bool  # a server answered (a wrong answer included); False: an outage, to be retried
    mistake: str | None  # what retrying cannot fix, with the fix (None: none found)


def diagnose_redis(
    url: str,
    keys: list[str],
    *,
    timeout: float,
    tls_ca_file: str | None = None,
    tls_cert_file: str | None = None,
    tls_key_file: str | None = None,
) -> str | None:
    """A mistake in ``url`` that retrying cannot fix, found by asking what it reaches, as the rest
    of one line after ``redis.url ...: `` (with the fix); None when all is well or Redis cannot be
    reached now (an outage, to be retried). Blocking: for start-up, before the node runs.

    Checked: sentinels that are not sentinels, cluster nodes that are not in cluster mode, a
    server that does not speak RESP, a database index beyond the server's ``databases``,
    credentials refused (``WRONGPASS``, ``NOAUTH``) and an ACL that denies ``keys`` (``NOPERM``).
    """
    return examine_redis(
        url, keys, timeout=timeout, tls_ca_file=tls_ca_file, tls_cert_file=tls_cert_file,
        tls_key_file=tls_key_file,
    ).mistake  # fmt: skip


def examine_redis(
    url: str,
    keys: list[str],
    *,
    timeout: float,
    tls_ca_file: str | None = None,
    tls_cert_file: str | None = None,
    tls_key_file: str | None = None,
) -> RedisDiagnosis:
    """:func:`diagnose_redis`'s checks, and whether a server answered at all: a node that found
    an outage asks again until one does (blocking, as ``diagnose_redis``)."""
    if is_sentinel_url(url):
        target = parse_sentinel_url(url)
        for host, port in target.sentinels:
            client = redis.Redis(
                host=host, port=port, socket_timeout=timeout, socket_connect_timeout=timeout,
                retry=Retry(NoBackoff(), 0), decode_responses=True, ssl=target.tls,
            )  # fmt: skip
            try:
                client.sentinel_masters()
            except redis.ResponseError as exc:
                if "unknown command" in str(exc).lower():
                    return RedisDiagnosis(True, (
                        f"{host}:{port} is not a sentinel (it answered: {str(exc).split(',')[0]}): "
                        "list the sentinels' addresses, or use redis://HOST:PORT/DB for a plain Redis"
                    ))  # fmt: skip
            except (redis.RedisError, OSError):
                pass
            finally:
                client.close()
    try:
        client = connect(
            url, timeout=timeout, tls_ca_file=tls_ca_file, tls_cert_file=tls_cert_file,
            tls_key_file=tls_key_file,
        )  # fmt: skip
    except (redis.RedisError, RedisClusterException):  # (the latter is no RedisError)
        if is_cluster_url(url):
            return _not_a_cluster(parse_cluster_url(url), timeout)
        return RedisDiagnosis(False, None)
    try:
        client.ping()
        for key in keys:
            client.exists(key)
    except redis.RedisError as exc:
        reached = not isinstance(exc, redis.ConnectionError | redis.TimeoutError)
        mistake = _mistake(exc, url, client, timeout)
        return RedisDiagnosis(reached or mistake is not None, mistake)
    finally:
        client.close()
    return RedisDiagnosis(True, None)


def _not_a_cluster(target: ClusterTarget, timeout: float) -> RedisDiagnosis:
    """Why no seed of a cluster URL gave a cluster client: a seed that is a plain Redis (cluster
    mode off) or that refuses the credentials is a mistake; seeds that do not answer, an outage."""
    reached = False
    for host, port in target.nodes:
        client = redis.Redis(
            host=host, port=port, username=target.username, password=target.password,
            socket_timeout=timeout, socket_connect_timeout=timeout, retry=Retry(NoBackoff(), 0),
            decode_responses=True, ssl=target.tls,
        )  # fmt: skip
        try:
            client.execute_command("CLUSTER", "INFO")
            reached = True
        except redis.ResponseError as exc:
            text = str(exc)
            if "cluster support disabled" in text or "unknown command" in text.lower():
                return RedisDiagnosis(True, (
                    f"{host}:{port} is not a Redis Cluster node (it answered: {text}): use "
                    "redis://HOST:PORT/DB for a plain Redis, or list the cluster's nodes in "
                    "redis+cluster://H:P[,H:P...]"
                ))  # fmt: skip
            if isinstance(exc, redis.AuthenticationError) or "WRONGPASS" in text or "NOAUTH" in text:
                return RedisDiagnosis(
                    True, f"authentication failed ({text.strip()}): fix the user and password in redis.url"
                )
            reached = True
        except (redis.RedisError, OSError):
            pass
        finally:
            client.close()
    return RedisDiagnosis(reached, None)


def _mistake(exc: redis.RedisError, url: str, client: Any, timeout: float) -> str | None:
    text = str(exc)
    if "DB index is out of range" in text:
        kw = client_kwargs(client)
        db = kw.get("db", "?")
        count = "its `databases` setting"
        try:
            pool = client.connection_pool
            probe = redis.Redis(connection_pool=redis.ConnectionPool(
                connection_class=pool.connection_class, **{**kw, "db": 0}
            ))  # fmt: skip
            try:
                count = f"{probe.config_get('databases')['databases']} databases"
            finally:
                probe.close()
        except (redis.RedisError, KeyError, TypeError, AttributeError):
            pass  # CONFIG denied, or a Sentinel pool: the message names the setting instead
        return (
            f"database {db} does not exist on this server (it has {count}): use a database number "
            "below that in redis.url, or raise `databases` in redis.conf"
        )
    if isinstance(exc, redis.AuthenticationError) or "WRONGPASS" in text or "NOAUTH" in text:
        return f"authentication failed ({text.strip()}): fix the user and password in redis.url"
    if isinstance(exc, redis.exceptions.NoPermissionError) or "NOPERM" in text:
        return (
            f"permission denied by the Redis ACL ({text.strip()}): the user needs the {KEY_PATTERN} "
            "keys, &* channels and scripting (see the Redis ACL section of docs/OPERATIONS.md)"
        )
    # A server that is not Redis may close, answer garbage, or wait for more (an HTTP server
    # reading a request's headers): ask it in a way any of them answers.
    if isinstance(exc, redis.ConnectionError | redis.TimeoutError) and (
        classify_redis_error(exc) != "connection refused"
    ):
        parts = urlsplit(url)
        if parts.scheme == "redis" and parts.hostname:
            return _resp_probe(parts.hostname, parts.port or 6379, timeout)
    return None
