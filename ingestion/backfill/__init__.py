"""Backfill: a span of history in parallel ranges, each an elected, fenced job (docs/BACKFILL.md)."""
