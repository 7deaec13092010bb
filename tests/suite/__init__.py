"""The repository's and the suite's own rules: the import layout, where tests and helpers live, skips
under CI."""
