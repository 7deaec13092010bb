"""How many records the next commit may carry: as many as the commits seen so far say fit in a
time budget, between a floor and a ceiling. I/O-free; the Ingestor feeds it each commit's size
and round trip (``trio.current_time``).

Why: far behind, the source hands over whole pages (Stellar RPC: up to 10,000 events), and each
commit is a round trip the next one waits for (it continues from the cursor the one before
wrote). Ten commits of 1,000 pay ten round trips, ten thread hops and ten script calls where one
would do; on two cores that alone held an RPC catch-up to about 0.63 of a plain client, against
0.74-0.80 with one commit a page (docs/BENCHMARKS.md). A commit script also holds Redis for its
whole run, so a commit may not grow past the budget (the supervisor gives a fifth of the call
bound: a renewal queued behind four jobs' commits at that edge still answers in time), and a
slow machine, a large record or a busy server shrinks it again at once (a round trip counts its
waiting too: commits of several jobs that queue behind each other shrink each other).

Rules: a commit of at least ``limit`` records that took at most half the budget doubles the
limit (up to ``ceiling``); one that took more than the budget sets it to what the budget would
have held at that commit's rate, with a fifth to spare (never below ``floor``); one whose outcome
is unknown (no answer within the call bound, or its term ended while it was in flight) sets it
back to ``floor`` (:meth:`failed`): the pace lives as long as the job's Ingestor, and the next term
must not send the same oversized commit again. The floor is what every commit carried before the
pace existed: the pace never makes commits smaller than that.
"""

from __future__ import annotations

import attrs


@attrs.define
class CommitPace:
    budget: float  # seconds a commit's round trip may take
    floor: int = 1000
    ceiling: int = 10_000
    limit: int = attrs.field(init=False, default=0)

    def __attrs_post_init__(self) -> None:
        if not 1 <= self.floor <= self.ceiling:
            raise ValueError(f"need 1 <= floor <= ceiling, got {self.floor}, {self.ceiling}")
        if not self.budget > 0:  # NaN too
            raise ValueError(f"budget must be positive, got {self.budget}")
        self.limit = self.floor

    def failed(self) -> None:
        """A commit's outcome is unknown: back to the floor."""
        self.limit = self.floor

    def observed(self, records: int, seconds: float) -> None:
        """A commit of ``records`` records answered after ``seconds``."""
        if records <= 0:
            return
        if seconds > self.budget:
            fits = int(records * self.budget / seconds * 0.8)
            self.limit = max(self.floor, min(self.limit, fits))
        elif records >= self.limit and seconds * 2 <= self.budget:
            self.limit = min(self.ceiling, self.limit * 2)
