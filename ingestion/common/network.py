"""A job pinned to its network: the passphrases by name, and the rules that judge what a source
says of its network and of its ledgers against what the job recorded. Pure: the clock is passed in.

Two questions, asked of every URL of a job's source on connect and then every ``network.check_ms``
(``ingestion/node/network.py`` asks them; each source's module reads the answers off the wire):

- **Which network is it on?** Horizon's root ``network_passphrase``, Stellar RPC's ``getNetwork``,
  the lake's ``networkPassphrase``. A URL that answers with another passphrase than the job's
  (its ``network`` setting, else the passphrase its first term recorded) is on another network:
  the job is never followed there (:func:`wrong_network`).
- **Is it still the chain the job committed from?** A network of the same passphrase can restart
  from ledger 1 (testnet and futurenet are reset every few months). The job keeps the hash of its
  last committed ledger ``L`` and its close time beside its cursor; the chain is another, at the
  first look that shows it (:class:`ResetJudge`):

  - when a URL holds ``L`` with another hash;
  - when a URL's latest ledger is below ``L`` but closed after ``L`` did. On one chain ledger
    numbers and close times rise together (the close time is the network's, agreed by consensus,
    not a clock of ours), so a ledger below ``L`` that closed later is on another chain; a
    replica merely lagging behind (a Horizon or an RPC behind a load balancer) serves ledgers
    that closed before ``L`` and is never taken for a reset by this rule;
  - when every URL's latest ledger stays below ``L`` for longer than ``network.reset_after_ms``
    (the bound for what the close times cannot tell: a source that does not say them, or a
    ``L`` kept without one; a lagging replica catches up within it, a reset chain does not).

  A URL that does not answer says nothing either way.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from ingestion.common.paging import TOID_LEDGER_SHIFT, InvalidPagingToken, token_key

# The public networks by the names a setting may use (stellar-core's and the SDKs' passphrases).
NETWORKS: dict[str, str] = {
    "pubnet": "Public Global Stellar Network ; September 2015",
    "testnet": "Test SDF Network ; September 2015",
    "futurenet": "Test SDF Future Network ; October 2022",
}


def passphrase_of(value: str) -> str:
    """The passphrase a ``network`` setting names: ``pubnet``, ``testnet``, ``futurenet`` (any
    case) or a passphrase as it is; "" for none."""
    text = value.strip()
    return NETWORKS.get(text.lower(), text)


def ledger_of(cursor: str | None) -> int | None:
    """The ledger a committed cursor lies in (an RPC event id or Horizon paging token: its TOID's
    ledger); None for none, ``0``, ``now`` or anything else."""
    if not cursor or cursor in ("0", "now"):
        return None
    try:
        return (token_key(cursor)[0] >> TOID_LEDGER_SHIFT) or None
    except InvalidPagingToken:
        return None


@attrs.frozen
class SourceLook:
    """What one URL of a job's source said of its network (None: it did not say)."""

    url: str
    passphrase: str | None
    latest: int | None = None  # its latest ledger (None: not asked, or not known)
    hash_at: str | None = None  # the hash of the ledger asked about (None: not held, not asked)
    # Close times (Unix seconds, the network's) of its latest ledger and of the ledger asked about
    # (None: not said).
    latest_closed_at: int | None = None
    closed_at: int | None = None


@attrs.frozen
class Verdict:
    """Why a job is not followed from its source: ``reason`` is ``wrong-network`` or
    ``network-reset`` (the hold-off's reason), ``detail`` one line naming what differs."""

    reason: str
    detail: str


def wrong_network(
    job: str, expected: str, looks: Sequence[SourceLook], *, configured: bool
) -> Verdict | None:
    """A :class:`Verdict` when a URL answers with another passphrase than ``expected`` (the job's
    ``network`` setting when ``configured``, else the one its first term recorded); None when
    every answering URL agrees, when none answered, or when nothing is expected yet."""
    if not expected:
        return None
    for look in looks:
        if look.passphrase is not None and look.passphrase != expected:
            where = "its network setting" if configured else "recorded by its first term"
            return Verdict(
                "wrong-network",
                f"job {job!r} is on network {expected!r} ({where}) but {look.url} is on "
                f"{look.passphrase!r}: that source is never followed; point the job at a source "
                f"of its network, or give it another name",
            )
    return None


def first_passphrase(looks: Sequence[SourceLook]) -> str | None:
    """The passphrase the job records when it has none: the first answering URL's."""
    return next((look.passphrase for look in looks if look.passphrase), None)


@attrs.define
class ResetJudge:
    """Whether the chain a job's source serves is still the one it committed from (see the module
    docstring). One per term; ``judge`` is called after each look with the time it was taken."""

    reset_after: float  # seconds every URL may stay below the committed ledger
    _below_since: float | None = None

    def judge(
        self, now: float, ledger: int | None, recorded_hash: str | None, looks: Sequence[SourceLook],
        recorded_closed_at: int | None = None,
    ) -> Verdict | None:
        """``ledger``: the job's last committed ledger; ``recorded_hash``, ``recorded_closed_at``:
        the hash and close time kept for it; ``looks``: each URL's latest ledger (and its close
        time) and its hash of ``ledger``."""
        if ledger is None:
            self._below_since = None
            return None
        answered = [look for look in looks if look.latest is not None]
        for look in answered:
            if recorded_hash and look.hash_at and look.hash_at != recorded_hash:
                return Verdict(
                    "network-reset",
                    f"{look.url} holds ledger {ledger} with hash {look.hash_at}, the job committed "
                    f"it with hash {recorded_hash}: the network was reset",
                )
            if (
                look.latest is not None and look.latest < ledger and recorded_closed_at is not None
                and look.latest_closed_at is not None and look.latest_closed_at > recorded_closed_at
            ):  # fmt: skip
                return Verdict(
                    "network-reset",
                    f"{look.url}'s latest ledger {look.latest} closed at {look.latest_closed_at}, after "
                    f"the job's last committed ledger {ledger} (closed at {recorded_closed_at}): a lower "
                    "ledger of the same chain cannot close later, the network was reset",
                )
        if not answered:
            return None  # nobody answered: nothing is known (the source's own retries say so)
        top = max(look.latest or 0 for look in answered)
        if top >= ledger:
            self._below_since = None
            return None
        if self._below_since is None:
            self._below_since = now
        below = now - self._below_since
        if below < self.reset_after:
            return None
        return Verdict(
            "network-reset",
            f"every URL's latest ledger ({top}) has been below the job's last committed ledger "
            f"{ledger} for {below:.1f} s: the network was reset",
        )
