"""A chaos campaign of the project's own: a real cluster on loopback under random faults from
every layer, and a judge that checks safety and the liveness bound B afterwards.

- ``campaign``: the run: the cluster, the rounds, healing, settling (a :class:`~chaos.report.Report`);
- ``jobs``: the five jobs and the nodes' config file;
- ``faults``: the kinds of fault, how a round is drawn, how each is carried out;
- ``polls``: each job's lease holder and cursor, polled while it runs;
- ``judge``: every sink checked after the run, with the rules of ``check`` (pure: histories in,
  violations out);
- ``report``: the verdict, as text and JSON;
- ``mutants``: deliberately broken builds the campaign must fail;
- ``__main__``: ``python -m chaos --seconds N --seed S`` (``./scripts/chaos``).

It stands beside ``benchmarks/``, outside the product package: it builds on the testing kit
(:mod:`ingestion.testing`) and the verifier (:mod:`ingestion.verify`); nothing in the node
imports it, and the wheel does not ship it.
"""
