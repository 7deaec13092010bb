"""The Horizon source: the follower's decisions, health, the probe, catch-up, against a scripted server
and the simulator."""
