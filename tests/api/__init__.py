"""The events API: its store, its JSON-RPC core and server, against a real PostgreSQL."""
