"""Leadership: the lease machine, the Elector and Heartbeat, fencing and token memory, balance, liveness
and source-aware hand-over, failover with real processes."""
