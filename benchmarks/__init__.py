"""Benchmarks: throughput, commit latency, failover distribution, standby cost. See run.py."""
