"""The audit of a job's store against an independent source: the data lake read again.

Pure: :mod:`~ingestion.audit.compare` (missing, extra, duplicated and differing records, each
named) and :mod:`~ingestion.audit.expect` (a lake object's expected records, run in the decode
workers). I/O: :mod:`~ingestion.audit.store` (the store's rows: PostgreSQL or Redis streams,
blocking) and :mod:`~ingestion.audit.runner` (the trio shell: the lake read in parallel, window by
window). The command is ``ingestion audit`` (:mod:`ingestion.cli.audit`); docs/RELIABILITY.md says
what it proves.
"""
