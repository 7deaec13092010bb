"""The pure liveness rules (actors/liveness.py) as plain functions, one behaviour per test."""

from __future__ import annotations

from actors.liveness import Campaign, HoldOff, Picture, campaign, preference

JOBS = ("a", "b", "c", "d")


def test_a_released_lease_placed_here_is_campaigned_for_at_once_despite_a_fallback_in_flight() -> None:
    # Three nodes, four jobs (share 2); "gone" drained, leaving two jobs free. Each remaining node
    # leads one; the placement gives each of them one of the free jobs.
    live = frozenset({"n1", "n2"})
    leaders = {"a": "gone", "b": "n1", "c": "gone", "d": "n2"}
    pictures = {
        n: Picture(n, live, JOBS, leaders={**leaders, "a": None, "c": None}, departed=frozenset({"gone"}))
        for n in live
    }
    placed = pictures["n1"].placement()
    assert placed == pictures["n2"].placement() and sorted(placed) == ["a", "c"]
    assert set(placed.values()) == {"n1", "n2"}  # one each: every node with room gets one
    for node, picture in pictures.items():
        mine = next(j for j, n in placed.items() if n == node)
        other = next(j for j, n in placed.items() if n != node)
        # The fallback campaign for the other job (after its rendezvous delay) is in flight here:
        # it must not hold back the job the placement gives this node.
        decision = campaign(picture, mine, {"b" if node == "n1" else "d", other}, free_for=0.0, ttl=1.5)
        assert decision == Campaign(0.0)


def test_a_node_at_its_share_is_placed_nothing_and_holds_off() -> None:
    live = frozenset({"n1", "n2"})
    picture = Picture("n1", live, JOBS, leaders={"a": "n1", "b": "n1", "c": None, "d": "n2"})
    assert picture.placement() == {"c": "n2"}
    assert campaign(picture, "c", {"a", "b"}, free_for=None, ttl=1.5) == HoldOff("share-reached")
    # ... unless the lease has been free for a TTL: then it adopts, after its rendezvous delay.
    adopt = campaign(picture, "c", {"a", "b"}, free_for=1.5, ttl=1.5)
    assert isinstance(adopt, Campaign) and adopt.adopting
    assert adopt.delay == 0.05 * preference("c", live).index("n1")


def test_a_fallback_campaign_waits_its_rank_up_to_the_caller_s_longest_delay() -> None:
    # Twelve nodes, one job: its last-ranked node falls back after 11 rank steps, capped at the
    # default 0.5 s, or at the longer wait a backfill's ranges ask for (their hosts notice a plan
    # by polling, a little apart).
    live = frozenset(f"n{i}" for i in range(12))
    last = preference("a", live)[-1]
    picture = Picture(last, live, ("a",))
    assert picture.placement() == {"a": preference("a", live)[0]}
    assert campaign(picture, "a", set(), free_for=None, ttl=1.5) == Campaign(0.5)
    assert campaign(picture, "a", set(), free_for=None, ttl=1.5, max_rank_delay=0.75) == Campaign(0.55)
    assert campaign(picture, "a", set(), free_for=None, ttl=1.5, max_rank_delay=0.3) == Campaign(0.3)
