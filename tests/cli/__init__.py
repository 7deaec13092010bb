"""What an operator runs and reads: the command line, settings, inspect, tail, watch, verify, status,
metrics, logs, the generated reference."""
