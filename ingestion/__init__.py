"""High-availability Stellar Horizon event ingestion with lease-based leader election."""

__version__ = "0.1.0"
