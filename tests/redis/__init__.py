"""Redis itself: the lease store and its Lua scripts, the local server, Sentinel, Cluster, security, its
clock, rollback and lost state."""
