"""What a running node serves besides its jobs: Prometheus ``metrics`` and the WebSocket ``status``."""
