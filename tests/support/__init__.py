"""What several test modules share (not tests, not fixtures: those are in conftest.py)."""
