"""A node as a process: the parent and its worker, the lease pipe between them, crashes."""
