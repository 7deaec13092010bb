"""A chaos campaign of the project's own: a real cluster on loopback under random faults from
every layer, and a judge that checks safety and the liveness bound B afterwards.

- ``check``: the judge's rules, pure (histories in, violations out);
- ``campaign``: the cluster, the fault rounds, the polls, and the verdict (a :class:`Report`);
- ``__main__``: ``python -m ingestion.chaos --seconds N --seed S`` (``./scripts/chaos``).

It builds on the testing kit (:mod:`ingestion.testing`) and the verifier (:mod:`ingestion.verify`);
nothing in the node imports it.
"""
