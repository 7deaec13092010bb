"""One ingestion node: its composition and its processes.

``build`` makes a job's source, store and sink from the settings; ``preflight`` checks them before
the node starts; ``identity`` records what each job follows and where it commits; ``worker`` is
the process that runs the jobs, ``parent`` the process that outlives it and releases its leases (told through
``lease_reports``); ``stop_signals``, ``sd_notify`` and ``logs`` are its process plumbing.
"""
