"""Every setting, by section: its type, default and help; the ``[jobs.NAME]`` keys; the flags.

The one table the rest of the package reads: :func:`~ingestion.config.settings.Settings.from_mapping`
checks values against it, the environment layer knows its variables from it, and
:func:`~ingestion.config.sample.sample_toml` writes the repo-root ``config.toml`` from it.
"""

from __future__ import annotations

from typing import Any

from ingestion.common.keyspace import watch_keys

# The schema: section -> key -> (type, default, help). Types: int, float, str, list[str], bool.
SCHEMA: dict[str, dict[str, tuple[type | str, Any, str]]] = {
    "node": {
        "id": (str, "", "this node's id in logs and in Redis; empty: <hostname>-<pid>"),
        "job": (
            "list[str]",
            [],
            "the singleton jobs this node hosts, each NAME or NAME=RESOURCE (--job repeated); "
            "empty: every [jobs.NAME] table, or when there is none one job named after "
            "node.source (horizon or rpc)",
        ),
        "state_dir": (
            str,
            "",
            "directory for the highest fencing token seen, kept across restarts (a file per job; "
            "nodes may share it); empty: memory only",
        ),
        "source": (
            str,
            "horizon",
            "what a job follows unless its [jobs.NAME] table says: horizon (a Horizon collection), "
            "rpc (Stellar RPC getEvents: contract events) or lake (the same events from a "
            "ledger-metadata data lake, lake.url; filters and start cursor from the rpc section)",
        ),
    },
    "redis": {
        "url": (
            str,
            "redis://127.0.0.1:6379/0",
            "redis:// or rediss:// (TLS) URL; user:password@ for an ACL user, :password@ for "
            "requirepass; redis+sentinel://[user:pass@]H:P[,H:P...]/SERVICE[/DB] (rediss+sentinel:// "
            "for TLS) to follow Sentinel's primary; redis+cluster://[user:pass@]H:P[,H:P...] "
            "(rediss+cluster://) for Redis Cluster",
        ),
        "min_replicas_acked": (
            int,
            -1,
            "replicas that must acknowledge (WAIT) each acquire and commit, else it counts as "
            "unknown and the term ends; -1: auto = 1 with Sentinel, 0 otherwise",
        ),
        "timeout_ms": (
            int,
            0,
            "ms, bound on every Redis call; 0: auto = min(500, safety_margin_ms / 2)",
        ),
        "tls_ca_file": (
            str,
            "",
            "CA bundle (PEM) to verify a rediss:// server; empty: system store",
        ),
        "tls_cert_file": (str, "", "client certificate (PEM) for a server with tls-auth-clients"),
        "tls_key_file": (str, "", "private key (PEM) of tls_cert_file"),
    },
    "lease": {
        "ttl_ms": (int, 5000, "ms, lease time-to-live in Redis (100 .. 3600000)"),
        "renew_interval_ms": (int, 0, "ms between renewals; 0: auto = ttl_ms / 5"),
        "safety_margin_ms": (
            int,
            0,
            "ms, ingestion stops this long before the lease could end; 0: auto = ttl_ms / 5",
        ),
        "clock_drift": (
            float,
            0.01,
            "fraction, allowed clock-rate difference between node and Redis (0 .. 0.5)",
        ),
        "standby_jitter_ms": (
            int,
            25,
            "ms, upper bound of the random delay added to a standby's wake-up",
        ),
    },
    "horizon": {
        "urls": ("list[str]", ["http://127.0.0.1:8000"], "Horizon base URLs, tried in order"),
        "resource": (
            str,
            "/operations",
            "collection to ingest, e.g. /payments, /trades, /accounts/G.../effects, "
            "/liquidity_pools/ID/trades; may end in ?include_failed=true and/or join=transactions",
        ),
        "start_cursor": (
            str,
            "now",
            "where a job starts when nothing is committed: now, 0 or a paging token",
        ),
        "connect_timeout_ms": (int, 2000, "ms, HTTP connect timeout"),
        "read_timeout_ms": (int, 30000, "ms, HTTP read timeout for a page request"),
        "stream_idle_timeout_ms": (
            int,
            65000,
            "ms, reconnect a stream silent this long (Horizon closes its own after 55 s)",
        ),
        "retry_base_ms": (int, 200, "ms, first retry delay after a connection error or 5xx"),
        "retry_cap_ms": (int, 10000, "ms, longest retry delay"),
        "failover_after": (int, 3, "count, consecutive failures before moving to the next URL"),
        "parallel_requests": (
            int,
            8,
            "count, page requests in flight at once while catching up a network-wide collection "
            "(ledger ranges paged side by side, committed in order); 1: strictly sequential",
        ),
        "handover_after_ms": (
            int,
            0,
            "ms every request to every Horizon URL may fail before a leader hands the lease to a "
            "node that reaches Horizon (at least lease.ttl_ms); 0: auto = 3 * lease.ttl_ms",
        ),
        "not_found_give_up_ms": (
            int,
            120000,
            "ms, an account-scoped resource answered 404 (an account not ingested yet) is retried "
            "and failed over until every URL has answered 404 this long; then the node exits 1",
        ),
        "stale_check_ms": (
            int,
            30000,
            "ms between reads of every Horizon URL's / to notice that the one in use is stale "
            "(only with several URLs); 0: never",
        ),
        "stale_after_ledgers": (
            int,
            10,
            "the Horizon in use is stale when its history is more than this many ledgers behind "
            "its stellar-core or another URL; the node then moves to the freshest (horizon-stale)",
        ),
        "on_history_gap": (
            str,
            "stop",
            "when the cursor is older than Horizon's retained history (history_elder_ledger): "
            "stop (log history-gap, write nothing, exit 1) or skip (record the gap in the audit "
            "stream and resume from the oldest retained ledger)",
        ),
        "complete_check_ms": (
            int,
            5000,
            "ms between a Horizon job's completeness looks while its stream hands nothing on (the "
            "root and one record after its position: a quiet job's complete_through follows "
            "Horizon's ledgers); 0: never (the watermark moves with records only)",
        ),
    },
    "rpc": {
        "urls": (
            "list[str]",
            ["http://127.0.0.1:8001"],
            "Stellar RPC URLs (JSON-RPC), tried in order, for jobs whose source is rpc",
        ),
        "start_cursor": (
            str,
            "now",
            "where an rpc job starts when nothing is committed: now, 0 (the oldest retained "
            "ledger), a ledger number (events from that ledger on) or an event id (after it)",
        ),
        "event_type": (str, "", "getEvents filter: contract, system, or empty for both"),
        "contract_ids": (
            "list[str]",
            [],
            "getEvents filter: contract ids (C...), at most 5; empty: every contract",
        ),
        "topics": (
            "list[str]",
            [],
            "getEvents filter: at most 5 topics, each SEG[,SEG...] (1 to 4 segments, then an optional "
            "**): a base64 ScVal, * (any one segment), ** (any rest), or sym:NAME, str:TEXT, "
            "address:G...|C..., u32:N, i32:N, u64:N, i64:N, u128:N, i128:N, bool:true|false "
            "(INGESTION_RPC_TOPICS: topics separated by ;)",
        ),
        "page_limit": (
            int,
            10000,
            "events per getEvents request (1 .. 10000; halved after a -32001 processing-limit "
            "answer, then restored): pages follow one another, so this sets the catch-up pace",
        ),
        "connect_timeout_ms": (int, 2000, "ms, HTTP connect timeout"),
        "request_timeout_ms": (int, 30000, "ms, the longest one getEvents request may take"),
        "retry_base_ms": (int, 200, "ms, first retry delay after an error"),
        "retry_cap_ms": (int, 10000, "ms, longest retry delay"),
        "failover_after": (int, 3, "count, consecutive failures before moving to the next URL"),
        "on_history_gap": (
            str,
            "stop",
            "when the cursor is older than the RPC's oldest retained ledger: stop (log "
            "history-gap, write nothing, exit 1), skip (record the gap in the audit stream and "
            "resume from the oldest ledger) or lake (record it, read the events in between from "
            "rpc.lake, then go on on RPC)",
        ),
        "lake": (
            str,
            "",
            "the data lake (a directory, file://PATH or s3://BUCKET/PREFIX) RPC jobs read history "
            "older than RPC keeps from, with on_history_gap = lake",
        ),
        "reset_after_ms": (
            int,
            60000,
            "ms every RPC URL may report a latest ledger below the cursor (a lagging node, or a "
            "network reset) before rpc-network-reset-suspected is logged; the node never jumps",
        ),
    },
    "lake": {
        "url": (
            str,
            "",
            "the ledger-metadata data lake (SEP-54, written by Galexie) of jobs whose source is lake: "
            "a directory, file://PATH or s3://BUCKET/PREFIX (anonymous reads unless the AWS credential "
            "chain finds credentials)",
        ),
        "endpoint_url": (
            str,
            "",
            "S3-compatible endpoint for an s3:// lake URL (\"\": AWS; AWS_REGION etc. from the environment)",
        ),
        "poll_interval_ms": (int, 1000, "ms between looks for the next object at the lake's tip"),
        "read_ahead": (
            int,
            4,
            "objects read and decoded ahead of the commits (bounds the memory: at most this many "
            "objects and their events are held)",
        ),
        "decode_processes": (
            int,
            1,
            "worker processes decoding lake objects (stellar-sdk's XDR decoder is pure Python: one "
            "process decodes on one core; 2 on a dedicated backfill node); 0: a thread of the node",
        ),
    },
    "network": {
        "passphrase": (
            str,
            "",
            "the network every horizon, rpc and lake job follows unless its table says (network = "
            "...): pubnet, testnet, futurenet or a passphrase; a source on another network is never "
            "followed (campaign-held-off reason=wrong-network); empty: each job's first term records "
            "its source's",
        ),
        "check_ms": (
            int,
            5000,
            "ms between a leader's looks at its source's network and ledgers (passphrase, latest "
            "ledger, the hash of the last committed ledger)",
        ),
        "reset_after_ms": (
            int,
            60000,
            "ms every URL of a job's source may report a latest ledger below the job's last "
            "committed ledger before the job counts its network as reset (network-reset: it "
            "commits nothing until `ingestion cursor reset`); another hash for that ledger counts "
            "at once",
        ),
    },
    "events": {
        "max_len": (
            int,
            0,
            "keep about this many entries in the events stream, never one a consumer group has "
            "not acknowledged (trimmed in each commit); 0: keep everything (the safe default: "
            "the stream then grows without bound, size Redis for it or set this)",
        ),
    },
    "sink": {
        "url": (
            str,
            "",
            "where jobs' records and cursors go: empty for the Redis events stream, or "
            "postgresql://USER:PASSWORD@HOST:PORT/DB (postgres:// too; libpq parameters such as "
            "?sslmode=verify-full&sslrootcert=FILE) for PostgreSQL; the election stays in Redis",
        ),
        "schema": (
            str,
            "ingestion",
            "PostgreSQL schema of the sink's tables (created at start when missing; see "
            "docs/POSTGRES.md)",
        ),
    },
    "observe": {
        "listen_host": (str, "127.0.0.1", "address the status and metrics endpoints listen on"),
        "metrics_port": (int, 0, "Prometheus /metrics and /healthz HTTP port; 0: off"),
        "status_port": (
            int,
            0,
            "WebSocket status port (python -m ingestion watch ws://host:port); 0: off",
        ),
        "console_token": (
            str,
            "",
            "unlocks the console's actions (hand over, pause/resume, replay dead letters) for who "
            "gives it; empty: the console is read-only; never shown (check-config says set)",
        ),
        "console_streams": (
            int,
            32,
            "live console pages (server-sent event streams) this node serves at once; one more "
            "is answered 503",
        ),
    },
    "api": {
        "job": (
            str,
            "",
            "the job whose events the events API serves (stellar-rpc's JSON-RPC, docs/API.md): its "
            "rows and its backfill ranges', each event once, kept in an indexed store by the "
            "projector job api.JOB this node then hosts; its sink must be PostgreSQL; empty: no API",
        ),
        "port": (int, 0, "the events API's HTTP port (JSON-RPC at POST /); 0: off"),
        "listen_host": (str, "", "address the events API listens on; empty: observe.listen_host"),
        "read_url": (
            str,
            "",
            "PostgreSQL the API reads (a streaming replica, say); empty: the job's sink URL",
        ),
        "max_filters": (int, 5, "filters a getEvents request may carry (stellar-rpc's 5 or more)"),
        "max_contract_ids": (int, 5, "contract ids a filter may carry (stellar-rpc's 5 or more)"),
        "max_topics": (int, 5, "topics a filter may carry (stellar-rpc's 5 or more)"),
        "max_limit": (int, 10000, "events a page may hold (stellar-rpc's 10000 or more)"),
        "default_limit": (int, 100, "events in a page whose request gives no limit"),
        "statement_timeout_ms": (
            int,
            5000,
            "a request's query runs at most this long on the server (then -32001)",
        ),
        "max_body_bytes": (int, 65536, "a request body over this is answered 413 unread"),
        "connections": (int, 8, "the API's reads at once at most (each a connection of its own)"),
        "max_subscribers": (
            int,
            1000,
            "event subscriptions (WebSocket /ws and SSE /events) a node serves at once; more are refused",
        ),
        "stream_outbox": (
            int,
            10000,
            "events a subscription may have waiting for its client; past it the client is cut (1008)",
        ),
        "stream_max_lag_ms": (
            int,
            10000,
            "a notification may wait this long for its client; past it the client is cut (1008)",
        ),
        "network_passphrase": (
            str,
            "Public Global Stellar Network ; September 2015",
            "what getNetwork answers: the network's passphrase",
        ),
        "protocol_version": (int, 23, "what getNetwork and getLatestLedger answer as the protocol version"),
    },
    "log": {
        "level": (str, "info", "debug, info, warning or error"),
        "format": (str, "auto", "json, console, or auto (console on a terminal, else json)"),
    },
}

LOG_LEVELS = ("debug", "info", "warning", "error")


# Where the environment layer puts webhook secrets (INGESTION_JOBS_<NAME>_SECRET) by upper-case
# job name, for the jobs' resolution to match with their tables.
JOB_SECRETS = "_job_secrets"

JOB_KINDS = ("horizon", "rpc", "lake", "scheduled", "webhook", "audit")
# A [jobs.NAME] table: key -> (type, help). Missing keys take the [horizon] (or [rpc]) settings.
JOB_SCHEMA: dict[str, tuple[type | str, str]] = {
    "kind": (
        str,
        "horizon (ingest a Horizon collection), rpc (Stellar RPC contract events), lake (the same "
        "events from a data lake), scheduled (run an action periodically), webhook or audit (check "
        "another job's store against the lake behind its watermark); default: node.source",
    ),
    "resource": (str, "the Horizon collection (default: horizon.resource)"),
    "start_cursor": (
        str,
        "where the job starts when nothing is committed (default: horizon.start_cursor, or "
        "rpc.start_cursor for an rpc job)",
    ),
    "horizon": ("list[str]", "Horizon base URLs for this job (default: horizon.urls)"),
    "rpc": ("list[str]", "rpc: Stellar RPC URLs for this job (default: rpc.urls)"),
    "lake": (
        str,
        "lake: the data lake of this job (default: lake.url); audit: the lake to check against "
        "(default: the audited job's lake, or rpc.lake)",
    ),
    "event_type": (str, "rpc, lake: contract, system or empty (default: rpc.event_type)"),
    "contract_ids": ("list[str]", "rpc, lake: contract ids to follow (default: rpc.contract_ids)"),
    "topics": ("list[str]", "rpc, lake: topics, each SEG[,SEG...] (default: rpc.topics)"),
    "action": (str, "scheduled: the action to run, module:function (async (run, term) -> dict)"),
    "period_ms": (int, "scheduled: ms between the end of a run and the start of the next"),
    "audits": (str, "audit: the rpc or lake job whose store is checked against the lake"),
    "every_ms": (int, "audit: ms between the end of a step and the start of the next (default 10000)"),
    "window": (int, "audit: ledgers checked per step, at most (default 64)"),
    "sink": (str, "where this job's records and cursor go (default: sink.url)"),
    "network": (
        str,
        "horizon, rpc, lake: the job's network, pubnet, testnet, futurenet or a passphrase "
        "(default: network.passphrase)",
    ),
    # decoded events and watch lists (docs/CONSUMING.md)
    "decode": (
        bool,
        "horizon, rpc, lake: add topicJson/valueJson (SEP-51) and the transfer view to each "
        "event, or to Horizon /payments records (default true)",
    ),
    "watch": (
        "list[str]",
        "horizon, rpc, lake: commit only records naming one of these addresses (G, M, C, B, L); "
        "the cursor still moves past the rest",
    ),
    "watch_file": (str, "horizon, rpc, lake: a watch list file, one address a line, reloaded on change"),
    "watch_set": (
        bool,
        f"horizon, rpc, lake: the watch list is the Redis set {watch_keys('JOB')['watch']}, edited with "
        "`ingestion watchlist` while the job runs",
    ),
    # webhook jobs (docs/WEBHOOKS.md)
    "from": (str, "webhook: the job whose committed records are delivered"),
    "url": (str, "webhook: the endpoint (http or https) every record is POSTed to"),
    "secret": (
        str,
        "webhook: the whsec_... signing secret (two, space separated, during a rotation); also "
        "secret_file or INGESTION_JOBS_<NAME>_SECRET; never logged or shown",
    ),
    "secret_file": (str, "webhook: a file holding the secret (its first line)"),
    "start": (str, "webhook: first, now (default) or a record id to deliver after"),
    "batch": (int, "webhook: records per POST, a JSON array when above 1 (default 1)"),
    "concurrency": (int, "webhook: POSTs in flight; above 1 gives up order (default 1)"),
    "retry_schedule": (
        "list[str]",
        "webhook: the waits between attempts (default 5s, 5m, 30m, 2h, 5h, 10h, 10h: 8 attempts "
        "over about 27.6 h)",
    ),
    "retry_probe_max_ms": (
        int,
        "webhook: between the schedule's attempts a failing record is tried again 1 s after a "
        "failure, then after a tenth of how long it has been failing, at most this far apart "
        "(default 30000; 0: the schedule alone)",
    ),
    "max_age_ms": (int, "webhook: a record failing this long is given up early (0: no limit)"),
    "on_exhausted": (str, "webhook: dead-letter (default: go on with the next record) or block"),
    "max_dead_letters": (
        int,
        "webhook: dead letters held (not replayed or dropped) at most; at the bound a spent record "
        "blocks delivery as with on_exhausted = block (default 0: no bound)",
    ),
    "connect_timeout_ms": (int, "webhook: connect timeout (default 2000)"),
    "timeout_ms": (int, "webhook: total time for one POST, answer included (default 15000)"),
    "ca_file": (str, "webhook: CA bundle that verifies the endpoint's TLS (default: the system's)"),
}


# The command-line flag of a setting, where there is one (documentation; tests keep it true).
FLAGS = {
    ("node", "id"): "--node-id",
    ("node", "job"): "--job",
    ("redis", "url"): "--redis",
    ("lease", "ttl_ms"): "--lease-ttl-ms",
    ("horizon", "urls"): "--horizon",
    ("horizon", "resource"): "--resource",
    ("horizon", "start_cursor"): "--start-cursor",
    ("node", "source"): "--source",
    ("rpc", "urls"): "--rpc",
    ("rpc", "start_cursor"): "--start-cursor",
    ("rpc", "event_type"): "--event-type",
    ("rpc", "contract_ids"): "--contract-id",
    ("rpc", "topics"): "--topic",
    ("lake", "url"): "--lake",
    ("events", "max_len"): "--events-max-len",
    ("sink", "url"): "--sink",
    ("observe", "metrics_port"): "--metrics-port",
    ("observe", "status_port"): "--status-port",
    ("log", "level"): "--log-level",
    ("log", "format"): "--log-format",
}
