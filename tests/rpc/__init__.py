"""The Stellar RPC source: settings, the follower, the protocol rules, the probe, the simulator's RPC,
real processes."""
