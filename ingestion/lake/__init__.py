"""The ledger-metadata data lake (SEP-54, written by Galexie) as a source of contract events."""
