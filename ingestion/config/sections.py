"""The configuration's values, one frozen class per section, and one per hosted job."""

from __future__ import annotations

from typing import Any

import attrs
import redis

from actors.lease import LeaseTiming
from actors.lease_store import connect
from ingestion.common.redact import redact


def _url(url: str) -> str:
    """A URL setting in a repr: its credentials masked."""
    return repr(redact(url))


def _urls(urls: tuple[str, ...]) -> str:
    return repr(tuple(redact(u) for u in urls))


@attrs.frozen
class NodeSettings:
    id: str
    jobs: tuple[str, ...]  # the job names this node hosts, in order (see Settings.jobs)
    state_dir: str
    source: str = "horizon"  # the kind of a job whose table does not say

    @property
    def job(self) -> str:
        """The first job: what single-job commands (``tail``) read by default."""
        return self.jobs[0]


@attrs.frozen
class WebhookSettings:
    """A webhook job's endpoint and delivery rules (``kind = "webhook"``)."""

    source_job: str  # ``from``
    source_kind: str  # the delivered job's kind (horizon, rpc, lake, scheduled): the events' type
    url: str = attrs.field(repr=_url)
    secret: str = attrs.field(repr=False)  # one or two whsec_... secrets, space separated
    batch: int = 1
    concurrency: int = 1
    retry_schedule: tuple[str, ...] = ()
    retry_probe_max_ms: int = 30000  # the longest wait between a failing record's probes (0: none)
    max_age_ms: int = 0
    on_exhausted: str = "dead-letter"
    max_dead_letters: int = 0  # dead letters held (not replayed or dropped) at most; 0: no bound
    connect_timeout_ms: int = 2000
    timeout_ms: int = 15000
    ca_file: str = ""


@attrs.frozen
class JobSettings:
    """One elected job hosted by the node."""

    name: str
    kind: str  # "horizon", "rpc", "lake" or "scheduled"
    resource: str
    start_cursor: str
    horizon_urls: tuple[str, ...] = attrs.field(repr=_urls)
    action: str = ""  # scheduled: "module:function"
    period_ms: int = 0
    rpc_urls: tuple[str, ...] = attrs.field(default=(), repr=_urls)  # rpc: the URLs and the getEvents filter
    event_type: str = ""
    contract_ids: tuple[str, ...] = ()
    topics: tuple[str, ...] = ()  # each "SEG[,SEG...]" as written
    # the job's sink URL: "" for the Redis events stream, else postgresql://
    sink: str = attrs.field(default="", repr=_url)
    # lake: the data lake (the filter fields above are its filter)
    lake_url: str = attrs.field(default="", repr=_url)
    webhook: WebhookSettings | None = None  # webhook: the endpoint and delivery rules
    source_sink: str = attrs.field(default="", repr=_url)  # webhook: where the delivered job's records are
    # horizon, rpc, lake (docs/CONSUMING.md, "Decoded events and watch lists"): contract events'
    # ScVals decoded and the transfer view added (Horizon: /payments records)
    decode: bool = True
    watch: tuple[str, ...] = ()  # only records naming one of these addresses are committed
    watch_file: str = ""  # ... or those in this file (one a line), reloaded when it changes
    watch_set: bool = False  # ... or those in the Redis set ingestion:{JOB}:watch
    # A backfill's range job (ingestion/backfill/): the job it is a range of, and its last ledger
    # (its source stops there). "" and 0 for every configured job.
    parent: str = ""
    last_ledger: int = 0
    # horizon, rpc, lake: the network's passphrase ("": the one its first term records)
    network: str = ""
    # audit (ingestion/audit/job.py): the audited job (an rpc or lake job of this configuration)
    # and the ledgers checked per step; its lake is lake_url, its pace period_ms
    audits: str = ""
    audit_window: int = 0

    @property
    def watching(self) -> bool:
        """Whether the job keeps only the records that name a watched address."""
        return bool(self.watch or self.watch_file or self.watch_set)

    def rpc_filters(self) -> tuple[Any, ...]:
        """The job's getEvents filters (:class:`ingestion.rpc.protocol.EventFilter`): one filter
        of the type, contract ids and topics given, or none (every event) when none is given.

        Raises:
            ValueError: a topic segment that is not a valid ScVal or wildcard.
        """
        # lazy: CLI start-up (rpc.protocol, ~5 ms)
        from ingestion.rpc.protocol import EventFilter, topic_from_text

        if not (self.event_type or self.contract_ids or self.topics):
            return ()
        types = (self.event_type,) if self.event_type else ()
        return (EventFilter(types, self.contract_ids, tuple(topic_from_text(t) for t in self.topics)),)


@attrs.frozen
class RedisSettings:
    url: str = attrs.field(repr=_url)
    timeout_ms: int
    min_replicas_acked: int
    tls_ca_file: str
    tls_cert_file: str
    tls_key_file: str

    def connect(self, timeout: float | None = None, connect_timeout: float | None = None) -> redis.Redis:
        """A client for ``url`` with the TLS files; every call bounded by ``timeout`` seconds
        (default ``timeout_ms``)."""
        return connect(
            self.url,
            timeout=self.timeout_ms / 1000 if timeout is None else timeout,
            connect_timeout=connect_timeout,
            tls_ca_file=self.tls_ca_file or None,
            tls_cert_file=self.tls_cert_file or None,
            tls_key_file=self.tls_key_file or None,
        )


@attrs.frozen
class LeaseSettings:
    ttl_ms: int
    renew_interval_ms: int
    safety_margin_ms: int
    clock_drift: float
    standby_jitter_ms: int

    @property
    def timing(self) -> LeaseTiming:
        return LeaseTiming(
            ttl=self.ttl_ms / 1000,
            renew_interval=self.renew_interval_ms / 1000,
            margin=self.safety_margin_ms / 1000,
            drift=self.clock_drift,
        )


@attrs.frozen
class HorizonSettings:
    urls: tuple[str, ...] = attrs.field(repr=_urls)
    resource: str
    start_cursor: str
    connect_timeout_ms: int
    read_timeout_ms: int
    stream_idle_timeout_ms: int
    retry_base_ms: int
    retry_cap_ms: int
    failover_after: int
    parallel_requests: int
    handover_after_ms: int
    not_found_give_up_ms: int
    stale_check_ms: int
    stale_after_ledgers: int
    on_history_gap: str
    complete_check_ms: int


@attrs.frozen
class RpcSettings:
    urls: tuple[str, ...] = attrs.field(repr=_urls)
    start_cursor: str
    event_type: str
    contract_ids: tuple[str, ...]
    topics: tuple[str, ...]
    page_limit: int
    connect_timeout_ms: int
    request_timeout_ms: int
    retry_base_ms: int
    retry_cap_ms: int
    failover_after: int
    on_history_gap: str
    reset_after_ms: int
    lake: str = ""  # the data lake history older than RPC keeps is read from (on_history_gap = lake)


@attrs.frozen
class NetworkSettings:
    passphrase: str = ""
    check_ms: int = 5000
    reset_after_ms: int = 60000


@attrs.frozen
class LakeSettings:
    url: str = attrs.field(repr=_url)
    endpoint_url: str = attrs.field(repr=_url)
    poll_interval_ms: int
    read_ahead: int
    decode_processes: int = 1


@attrs.frozen
class EventsSettings:
    max_len: int


@attrs.frozen
class SinkSettings:
    url: str = attrs.field(repr=_url)
    schema: str


@attrs.frozen
class ObserveSettings:
    listen_host: str
    metrics_port: int
    status_port: int
    console_token: str = attrs.field(default="", repr=False)  # a secret: never in a repr or a log
    console_streams: int = 32  # live console pages served at once (one more: 503)


@attrs.frozen
class ApiSettings:
    """The events API (docs/API.md): the job it serves, where, and what a request may ask."""

    job: str = ""
    port: int = 0
    listen_host: str = ""
    read_url: str = attrs.field(default="", repr=_url)
    max_filters: int = 5
    max_contract_ids: int = 5
    max_topics: int = 5
    max_limit: int = 10000
    default_limit: int = 100
    statement_timeout_ms: int = 5000
    max_body_bytes: int = 65536
    connections: int = 8
    max_subscribers: int = 1000
    stream_outbox: int = 10000
    stream_max_lag_ms: int = 10000
    network_passphrase: str = "Public Global Stellar Network ; September 2015"
    protocol_version: int = 23


@attrs.frozen
class LogSettings:
    level: str
    format: str
