"""The PostgreSQL sink, its tools, and real processes on it."""
