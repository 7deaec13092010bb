"""A public testing kit, like ``trio.testing``: what the tests, the benchmarks and the demo build on.

- ``local_redis``, ``local_postgres``: throwaway redis-server and PostgreSQL servers on loopback;
- ``cluster``: the one harness that starts Redis (or a Sentinel deployment), the simulator,
  PostgreSQL, the example receiver and node processes and reads their JSON logs (``LogLine``), with
  faults (signals, partitions, clock jumps, Redis restarts) and the exactly-once checks; the tests,
  the benchmarks, the demo and the chaos campaign run on it;
- ``cluster_config``: what a cluster runs, as values (job specs, faults), and the one config file
  its nodes read, rendered from them; ``children``: its processes and their log;
- ``processes``: the same node and simulator processes, driven from plain threads (the benchmarks);
- ``tcp_proxy``, ``http_fault_proxy``: faults between a node and Redis or a source;
- ``redis_ha``: Redis Sentinel groups (and the scenarios on them);
- ``recorded``: the recorded real Horizon responses and lake objects;
- ``wait``: waiting for a condition, and reading children's JSON lines.
- ``receiver``: the example webhook receiver (verifies with ``standardwebhooks``: the ``receiver`` extra).

Shipped code: nothing here imports pytest at import time.
"""
