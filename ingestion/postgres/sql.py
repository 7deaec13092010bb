"""The PostgreSQL sink's contract: its tables, its two functions, and the migration rule. Pure:
SQL text and decisions, no I/O (``ingestion/postgres/connection.py`` creates them,
``ingestion/postgres/sink.py`` and ``ingestion/postgres/fence.py`` run them).

Tables, in the schema ``sink.schema`` (default ``ingestion``), one set shared by every job:

- ``events (job, seq, paging_token, token, record json, committed_at)``: the records, ``seq``
  1, 2, 3, ... per job in commit order (primary key ``(job, seq)``), ``token`` the fencing token
  of the term that committed the row; ``record`` is the text as sent (``json`` keeps it, and
  takes the escape ``\\u0000`` that ``jsonb`` refuses).
- ``cursors (job, cursor, token, complete_through, complete_held)``: the committed cursor of each
  job and the token that moved it; ``complete_through`` (version 4, nullable) the job's
  completeness watermark, a ledger: every record the source holds for ledgers up to it is in
  ``events``, committed with the cursor; ``complete_held`` (version 4, nullable) why a known gap
  holds it there for good (a reader joins ``cursors`` on ``job`` to know how far ``events`` is
  complete).
- ``fences (job, token, node, domain)``: the highest token that opened a term for the job and the
  node that opened it; the token only ever rises, and an equal token from another node is refused
  (a Redis that issued a token twice, its grant lost in a failover, gets one writer under it).
  ``domain`` (version 3, nullable): the election domain, the Redis deployment whose nodes lead the
  job (its own id, ``LeaseStore.deployment_id``; before issue 46 its URL's name,
  ``actors.lease_store.deployment_name``), recorded by the first term that names one.
- ``terms (job, token, after_seq, opened_at)``: the fence's history: term ``token`` opened when
  the job's last row was ``after_seq`` (what ``verify`` judges a job by).

Two functions, each one statement and so one transaction, the way the Redis commit script is one
atomic call. Their names carry the contract's version (``_v3``, ``_v4``): in a fleet of mixed versions each
node calls its own, and starting a node never replaces what another version runs.

- ``open_term_v3(job, token, node, domain)``: refuses a term from another election domain than
  the job's (``other-domain``, whatever the token: tokens of two Redis deployments do not
  compare; the answer names the owner); raises the fence to ``(token, node)`` (refused,
  ``stale-token``, when it is higher already, or equal and opened by another node; the answer
  names the fence), records the raise in ``terms`` and the domain when none is recorded yet,
  answers the committed cursor. A NULL ``domain`` (job code's fence) neither records nor checks
  one.
- ``commit_batch_v4(job, token, node, previous, cursor, max_len, paging_tokens[], records[],
  complete_through, complete_held)``:
  locks the fence row, refuses unless it holds exactly ``token`` from ``node`` (``stale-token``
  when higher or another node's, ``term-not-open`` when lower), the stored cursor is
  ``previous`` (``cursor-moved``), and the batch continues it by the Redis commit script's rule
  (``actors/cursor_order.py``): every paging token well formed (``bad-paging-token``) and
  strictly after the one before, the first after ``previous``, and ``cursor`` the last token or
  an anchor after it (``not-after-cursor``); then inserts the rows after the job's last ``seq``,
  moves the cursor (and the watermark), deletes rows beyond ``max_len`` (0: keep all), and ``NOTIFY``s channel
  ``<schema>_events`` with ``{"job", "seq", "cursor"}``, delivered when the transaction commits,
  unless PostgreSQL's notification queue is fuller than ``ingestion.notify_queue_limit`` (a
  setting, default 0.5 of the queue): a listener that stopped reading holds the server's one
  queue, and once it is full every transaction that notifies fails at COMMIT (so no handler in
  the function could save the commit). Past the limit the commit lands without its notice, and
  readers find its rows by reading again, as ``tail`` does at least once a second.
  The sink checks the batch before sending it too (``actors.sink.continuation``): the function's
  check is for every other caller, a direct call included.

Version 4 (``commit_batch_v4``) is version 3's ``commit_batch`` with the completeness watermark:
two more arguments (the ledger, NULL for none, and why a known gap holds it, '' for none; both
defaulted, so a call with version 3's arguments commits no watermark), set
beside the cursor under the same fence (it only rises, and never once held), and answered with
the row. A new name rather than a changed ``_v3``: a node of version 3 still calls its own, which
leaves the new columns as they are. ``open_term`` is unchanged (``open_term_v3``).

Version 3 (the ``_v3`` names) differs from version 2 in ``open_term`` (the election domain: a
fourth argument and the ``fences.domain`` column) and ``commit_batch`` (the continuity check and
the notification queue's limit).

Migration rule: at start the sink creates what is missing and never alters or drops anything. A
table that exists must have at least the columns below with these types (extra columns are
allowed: a later version may only add columns, nullable or with a default, and the columns of
:data:`ADDED_COLUMNS` are added to a table that lacks them); a function of this
version's name is created when missing and replaced when its text differs (only a change made
without a new version name, i.e. in development).
"""

from __future__ import annotations

import re

import attrs

SCHEMA_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")

# table -> (column, information_schema data_type), the contract's columns.
COLUMNS: dict[str, tuple[tuple[str, str], ...]] = {
    "fences": (("job", "text"), ("token", "bigint"), ("node", "text")),
    "cursors": (("job", "text"), ("cursor", "text"), ("token", "bigint")),
    "events": (
        ("job", "text"),
        ("seq", "bigint"),
        ("paging_token", "text"),
        ("token", "bigint"),
        ("record", "json"),
        ("committed_at", "timestamp with time zone"),
    ),
    "terms": (("job", "text"), ("token", "bigint"), ("after_seq", "bigint"),
              ("opened_at", "timestamp with time zone")),
}  # fmt: skip

# table -> (column, data_type, its DDL): columns a later version added (nullable, or with a
# default), added to a table that lacks them; the migration rule allows nothing else.
ADDED_COLUMNS: dict[str, tuple[tuple[str, str, str], ...]] = {
    "fences": (("domain", "text", "text"),),  # v3: the election domain that owns the job
    # v4: the completeness watermark (a ledger) and why a known gap holds it (NULL: none does)
    "cursors": (("complete_through", "bigint", "bigint"), ("complete_held", "text", "text")),
}

_TABLES = {
    "fences": "job text PRIMARY KEY, token bigint NOT NULL, node text NOT NULL DEFAULT '', domain text",
    "cursors": (
        "job text PRIMARY KEY, cursor text NOT NULL, token bigint NOT NULL, complete_through bigint, "
        "complete_held text"
    ),
    "events": (
        "job text NOT NULL, seq bigint NOT NULL, paging_token text NOT NULL, token bigint NOT NULL, "
        "record json NOT NULL, committed_at timestamptz NOT NULL DEFAULT now(), "
        "PRIMARY KEY (job, seq)"
    ),
    "terms": (
        "job text NOT NULL, token bigint NOT NULL, after_seq bigint NOT NULL, "
        "opened_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (job, token)"
    ),
}

OPEN_TERM_BODY = """
DECLARE
  fence bigint;
  holder text;
  owned_by text;
  last bigint;
BEGIN
  INSERT INTO {s}.fences (job, token) VALUES (p_job, 0) ON CONFLICT (job) DO NOTHING;
  SELECT f.token, f.node, f.domain INTO fence, holder, owned_by
    FROM {s}.fences f WHERE f.job = p_job FOR UPDATE;
  IF owned_by IS NOT NULL AND p_domain IS NOT NULL AND owned_by <> p_domain THEN
    RETURN QUERY SELECT false, 'other-domain'::text, fence, NULL::text, owned_by;
    RETURN;
  END IF;
  IF fence > p_token OR (fence = p_token AND holder IS DISTINCT FROM p_node) THEN
    RETURN QUERY SELECT false, 'stale-token'::text, fence, NULL::text, owned_by;
    RETURN;
  END IF;
  owned_by := coalesce(owned_by, p_domain);
  IF fence < p_token THEN
    UPDATE {s}.fences SET token = p_token, node = p_node, domain = owned_by WHERE job = p_job;
    SELECT coalesce(max(e.seq), 0) INTO last FROM {s}.events e WHERE e.job = p_job;
    INSERT INTO {s}.terms (job, token, after_seq) VALUES (p_job, p_token, last)
      ON CONFLICT DO NOTHING;
  ELSE
    UPDATE {s}.fences SET domain = owned_by WHERE job = p_job;
  END IF;
  RETURN QUERY SELECT true, ''::text, p_token,
    (SELECT c.cursor FROM {s}.cursors c WHERE c.job = p_job), owned_by;
END
"""

COMMIT_BODY = """
DECLARE
  fence bigint;
  holder text;
  stored text;
  last bigint;
  n bigint := coalesce(array_length(p_tokens, 1), 0);
  trimmed bigint := 0;
  chain text[];
  joined text;
  shaped boolean;
  refusal text;
  limit_setting text;
BEGIN
  SELECT f.token, f.node INTO fence, holder FROM {s}.fences f WHERE f.job = p_job FOR UPDATE;
  SELECT c.cursor INTO stored FROM {s}.cursors c WHERE c.job = p_job;
  IF fence IS NULL OR fence < p_token THEN
    RETURN QUERY SELECT false, 'term-not-open'::text, coalesce(fence, 0), stored, 0::bigint, 0::bigint;
    RETURN;
  END IF;
  IF fence > p_token OR holder IS DISTINCT FROM p_node THEN
    RETURN QUERY SELECT false, 'stale-token'::text, fence, stored, 0::bigint, 0::bigint;
    RETURN;
  END IF;
  IF stored IS DISTINCT FROM p_previous THEN
    RETURN QUERY SELECT false, 'cursor-moved'::text, fence, stored, 0::bigint, 0::bigint;
    RETURN;
  END IF;
  -- Continuity, the Redis script's rule (actors/cursor_order.py): the stored cursor, the batch's
  -- paging tokens and the anchor (the new cursor unless it is the last token) each well formed
  -- (an int64 position, then an optional uint32 sub-position) and strictly after the one before,
  -- compared as numbers; the first failure names the reason. One match over the whole chain
  -- checks the shape of a well-formed batch (a match per token costs microseconds each).
  chain := CASE WHEN n > 0 AND p_cursor = p_tokens[n] THEN p_tokens ELSE array_append(p_tokens, p_cursor) END;
  IF p_previous IS NOT NULL THEN
    chain := array_prepend(p_previous, chain);
  END IF;
  joined := array_to_string(chain, ',', '');  -- (a comma inside a token shows in the count)
  shaped := joined ~ '^[0-9]{1,19}(-[0-9]{1,10})?(,[0-9]{1,19}(-[0-9]{1,10})?)*$'
    AND length(joined) - length(replace(joined, ',', '')) = cardinality(chain) - 1;
  SELECT x.refusal INTO refusal FROM (
    SELECT k.i, CASE WHEN k.pos IS NULL THEN 'bad-paging-token'
                     WHEN (k.pos, k.sub) <= (lag(k.pos) OVER w, lag(k.sub) OVER w) THEN 'not-after-cursor'
                END AS refusal
    FROM (
      SELECT c.i, CASE WHEN (shaped OR c.t ~ '^[0-9]{1,19}(-[0-9]{1,10})?$')
                         AND (length(c.a) < 19 OR c.a COLLATE "C" <= '9223372036854775807')
                         AND (length(c.b) < 10 OR c.b COLLATE "C" <= '4294967295')
                  THEN c.a::bigint END AS pos,
             coalesce(nullif(c.b, '')::bigint, 0) AS sub
      FROM (SELECT u.i, u.t, split_part(u.t, '-', 1) AS a, split_part(u.t, '-', 2) AS b
            FROM unnest(chain) WITH ORDINALITY AS u(t, i)) c
    ) k WINDOW w AS (ORDER BY k.i)
  ) x WHERE x.refusal IS NOT NULL ORDER BY x.i LIMIT 1;
  IF refusal IS NOT NULL THEN
    RETURN QUERY SELECT false, refusal, fence, stored, 0::bigint, 0::bigint;
    RETURN;
  END IF;
  SELECT coalesce(max(e.seq), 0) INTO last FROM {s}.events e WHERE e.job = p_job;
  IF n > 0 THEN
    INSERT INTO {s}.events (job, seq, paging_token, token, record)
      SELECT p_job, last + r.i, r.pt, p_token, r.rec::json
      FROM unnest(p_tokens, p_records) WITH ORDINALITY AS r(pt, rec, i);
  END IF;
  INSERT INTO {s}.cursors (job, cursor, token) VALUES (p_job, p_cursor, p_token)
    ON CONFLICT (job) DO UPDATE SET cursor = excluded.cursor, token = excluded.token;
  IF p_max_len > 0 AND n > 0 THEN
    DELETE FROM {s}.events e WHERE e.job = p_job AND e.seq <= last + n - p_max_len;
    GET DIAGNOSTICS trimmed = ROW_COUNT;
  END IF;
  -- PostgreSQL's one notification queue, held behind its slowest listener, fails every NOTIFY
  -- on the server at commit once it is full (a plpgsql handler cannot catch that: it is raised
  -- at COMMIT, after this function). Past the limit (unset or malformed: 0.5), the commit
  -- lands without its notice.
  limit_setting := current_setting('ingestion.notify_queue_limit', true);
  IF pg_notification_queue_usage() < (CASE WHEN limit_setting ~ '^ *[0-9]*[.]?[0-9]+ *$'
                                            THEN limit_setting::float8 ELSE 0.5 END) THEN
    PERFORM pg_notify({channel},
      json_build_object('job', p_job, 'seq', last + n, 'cursor', p_cursor)::text);
  END IF;
  RETURN QUERY SELECT true, ''::text, fence, p_cursor, last + n, trimmed;
END
"""

# Version 4 of commit_batch: version 3's body, and the completeness watermark committed with the
# cursor (two more arguments, two more columns answered). Its text is version 3's with these two
# statements replaced, so that the two read side by side.
COMMIT_BODY_V4 = COMMIT_BODY.replace(
    """  SELECT c.cursor INTO stored FROM {s}.cursors c WHERE c.job = p_job;
""",
    """  SELECT c.cursor, c.complete_held INTO stored, was_held FROM {s}.cursors c WHERE c.job = p_job;
""",
).replace(
    """  last bigint;
""",
    """  last bigint;
  was_held text;
  mark bigint;
  held text;
""",
    1,
).replace(
    """  INSERT INTO {s}.cursors (job, cursor, token) VALUES (p_job, p_cursor, p_token)
    ON CONFLICT (job) DO UPDATE SET cursor = excluded.cursor, token = excluded.token;
""",
    """  -- The watermark only rises, and never once a known gap holds it (complete_held).
  INSERT INTO {s}.cursors AS c (job, cursor, token, complete_through, complete_held)
    VALUES (p_job, p_cursor, p_token, p_complete_through, nullif(p_complete_held, ''))
    ON CONFLICT (job) DO UPDATE SET cursor = excluded.cursor, token = excluded.token,
      complete_through = CASE WHEN c.complete_held IS NOT NULL THEN c.complete_through
                              ELSE greatest(c.complete_through, excluded.complete_through) END,
      complete_held = coalesce(c.complete_held, excluded.complete_held)
    RETURNING c.complete_through, c.complete_held INTO mark, held;
""",
).replace(
    """  RETURN QUERY SELECT true, ''::text, fence, p_cursor, last + n, trimmed;
""",
    """  RETURN QUERY SELECT true, ''::text, fence, p_cursor, last + n, trimmed, mark,
    coalesce(held, ''), was_held IS NULL AND held IS NOT NULL;
""",
).replace(
    """RETURN QUERY SELECT false, 'term-not-open'::text, coalesce(fence, 0), stored, 0::bigint, 0::bigint;""",
    """RETURN QUERY SELECT false, 'term-not-open'::text, coalesce(fence, 0), stored, 0::bigint, 0::bigint,
      NULL::bigint, ''::text, false;""",
)
for _reason in ("'stale-token'::text", "'cursor-moved'::text", "refusal"):
    COMMIT_BODY_V4 = COMMIT_BODY_V4.replace(
        f"RETURN QUERY SELECT false, {_reason}, fence, stored, 0::bigint, 0::bigint;",
        f"RETURN QUERY SELECT false, {_reason}, fence, stored, 0::bigint, 0::bigint, NULL::bigint, "
        "''::text, false;",
    )

# The functions' names carry the contract's version: a node calls only its own version's.
OPEN_TERM = "open_term_v3"
COMMIT_BATCH = "commit_batch_v4"

FUNCTIONS = {
    OPEN_TERM: (
        "p_job text, p_token bigint, p_node text, p_domain text",
        "TABLE(ok boolean, reason text, fence bigint, cursor text, owner text)",
        OPEN_TERM_BODY,
    ),
    COMMIT_BATCH: (
        "p_job text, p_token bigint, p_node text, p_previous text, p_cursor text, p_max_len bigint, "
        "p_tokens text[], p_records text[], p_complete_through bigint DEFAULT NULL, "
        "p_complete_held text DEFAULT ''",
        "TABLE(ok boolean, reason text, fence bigint, stored text, last_seq bigint, trimmed bigint, "
        "complete_through bigint, complete_held text, newly_held boolean)",
        COMMIT_BODY_V4,
    ),
}


class SchemaMismatch(ValueError):
    """A table of the sink's schema exists with other columns: one line naming ``sink.schema``."""


def quoted(schema: str) -> str:
    """``schema`` as an SQL identifier (config has checked it against :data:`SCHEMA_NAME`).

    Raises:
        ValueError: not a plain lower-case identifier.
    """
    if not SCHEMA_NAME.fullmatch(schema):
        raise ValueError(f"not a plain lower-case SQL identifier: {schema!r}")
    return f'"{schema}"'


def channel(schema: str) -> str:
    """The ``NOTIFY`` channel a commit signals: ``<schema>_events`` (``ingestion_events``)."""
    return f"{schema}_events"


def create_table(schema: str, table: str) -> str:
    return f"CREATE TABLE IF NOT EXISTS {quoted(schema)}.{table} ({_TABLES[table]})"


def function_body(schema: str, name: str) -> str:
    body = FUNCTIONS[name][2]
    return body.replace("{s}", quoted(schema)).replace("{channel}", f"'{channel(schema)}'")


def create_function(schema: str, name: str) -> str:
    params, returns, _ = FUNCTIONS[name]
    return (
        f"CREATE OR REPLACE FUNCTION {quoted(schema)}.{name}({params}) RETURNS {returns} "
        f"LANGUAGE plpgsql AS $fn${function_body(schema, name)}$fn$"
    )


def text_array(values: list[str]) -> str:
    """``values`` as a PostgreSQL ``text[]`` literal (sent as one text parameter, cast with
    ``::text[]``): every element quoted, ``\\`` and ``"`` escaped. The driver's own array dumper
    costs about 0.1 ms per 1 KB record in Python; this is two C-level replaces per element."""
    quoted = ['"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"' for v in values]
    return "{" + ",".join(quoted) + "}"


def add_column(schema: str, table: str, column: str, ddl: str) -> str:
    return f"ALTER TABLE {quoted(schema)}.{table} ADD COLUMN IF NOT EXISTS {column} {ddl}"


def missing_columns(table: str, found: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The columns a later version added that ``table`` (found with these columns) lacks:
    (column, DDL) to add."""
    have = dict(found)
    return [(c, ddl) for c, _, ddl in ADDED_COLUMNS.get(table, ()) if c not in have]


def column_problem(schema: str, table: str, found: list[tuple[str, str]]) -> str | None:
    """Why ``table`` (its (column, data_type) pairs, empty: missing) breaks the contract, or None
    (a column a later version added may be missing: it is added)."""
    have = dict(found)
    wanted = list(COLUMNS[table])
    wanted += [(c, t) for c, t, _ in ADDED_COLUMNS.get(table, ()) if c in have]
    missing = [f"{c} {t}" for c, t in wanted if have.get(c) != t]
    if not found or not missing:
        return None
    return (
        f"sink.schema: table {schema}.{table} exists with other columns (lacks {', '.join(missing)}): "
        f"give another sink.schema, or move that table away"
    )


@attrs.frozen
class OpenAnswer:
    """What ``open_term`` answered (one row): ``reason`` ``stale-token`` or ``other-domain``
    when refused; ``owner`` the election domain the job belongs to (None: not recorded yet)."""

    ok: bool
    reason: str
    fence: int
    cursor: str | None
    owner: str | None

    @classmethod
    def from_row(cls, row: tuple[object, ...]) -> OpenAnswer:
        ok, reason, fence, cursor, owner = row
        return cls(bool(ok), str(reason), int(fence), None if cursor is None else str(cursor),  # type: ignore[call-overload]
                   None if owner is None else str(owner))  # fmt: skip


def owned_by(row: tuple[object, ...]) -> str | None:
    """The owner an ``open_term`` answer names when it refused the term as ``other-domain``."""
    answer = OpenAnswer.from_row(row)
    return answer.owner if answer.reason == "other-domain" else None


def adopt_domain(schema: str) -> str:
    """The statement that moves a job's fence from its deployment's former name to its id
    (arguments: the id, the job, the name), and only from that name."""
    return f"UPDATE {quoted(schema)}.fences SET domain = %s WHERE job = %s AND domain = %s"


def other_domain(schema: str, job: str, owner: str, mine: str) -> str:
    """One line for a term refused because another election domain (a Redis deployment, by its
    id) owns the job in ``schema``: both named, and the two ways on."""
    return (
        f"job {job!r} in PostgreSQL schema {schema} belongs to the nodes of Redis {owner}, this "
        f"node's Redis is {mine}: run this job's nodes on that Redis (or give it another name); "
        f"to move the job to this Redis on purpose, stop the nodes on {owner} and run "
        f"UPDATE {quoted(schema)}.fences SET domain = NULL WHERE job = '{job.replace(chr(39), chr(39) * 2)}'"
    )


@attrs.frozen
class CommitAnswer:
    """What ``commit_batch`` answered (one row)."""

    ok: bool
    reason: str
    fence: int
    stored: str | None
    last_seq: int
    trimmed: int
    complete_through: int | None = None
    complete_held: str = ""
    newly_held: bool = False

    @classmethod
    def from_row(cls, row: tuple[object, ...]) -> CommitAnswer:
        ok, reason, fence, stored, last_seq, trimmed, mark, held, newly_held = row
        return cls(bool(ok), str(reason), int(fence), stored if stored is None else str(stored),  # type: ignore[call-overload]
                   int(last_seq), int(trimmed), None if mark is None else int(mark),  # type: ignore[call-overload]
                   str(held or ""), bool(newly_held))  # fmt: skip


def verify_fences(rows: list[tuple[int, int]], terms: list[tuple[int, int]]) -> list[str]:
    """Judge a job's rows by its fence history. ``rows``: (seq, token) in ``seq`` order;
    ``terms``: (token, after_seq) in token order. Returns one line per violation.

    A row is good when its token never decreases along ``seq`` and, once term ``t`` opened after
    row ``s``, no row past ``s`` carries a token below ``t``: the fence refused every such commit.
    (A row just before the raise may carry the older token: the stale leader's commit that landed
    before the new term's first transaction, harmless by continuity.)"""
    problems: list[str] = []
    previous_seq, previous_token = 0, 0
    floors = sorted(terms, key=lambda t: t[1])
    k, floor = 0, 0
    for seq, token in rows:
        if seq != previous_seq + 1 and previous_seq:
            problems.append(f"seq {seq} follows {previous_seq}: a gap")
        if token < previous_token:
            problems.append(f"seq {seq}: token {token} after token {previous_token}")
        while k < len(floors) and floors[k][1] < seq:
            floor = max(floor, floors[k][0])
            k += 1
        if token < floor:
            problems.append(f"seq {seq}: token {token} committed after the fence rose to {floor}")
        previous_seq, previous_token = seq, token
    return problems
