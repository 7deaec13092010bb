"""The ingest pipeline: the Ingestor's commits and scope, cursors, paging tokens, history gaps,
retention of the events stream, end to end."""
