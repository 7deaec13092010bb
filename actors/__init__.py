"""The node's actors: Elector, Heartbeat, Ingestor and CursorWriter, and the supervisor wiring them."""
