"""deploy/: Grafana, Kubernetes, Prometheus and systemd files checked with their own tools."""
