"""The transfer view of a token event: who moved how much of what. Pure.

A wallet wants one shape for every movement of a token, whichever contract emitted it and under
which protocol: ``{"kind", "from", "to", "amount", "asset", "to_muxed_id"}``. This module reads it
off an event's SEP-51 JSON topics and value (:mod:`ingestion.decode.scval`), by the rules of SEP-41
(the token interface), the Stellar Asset Contract (SAC) before protocol 23, and CAP-67 (the unified
events of protocol 23, which the data lake also backfills into older ledgers):

=================================  =======================  ==============================
topics                             from / to                asset
=================================  =======================  ==============================
``transfer, from, to``             from / to                null (the contract names it)
``transfer, from, to, asset``      from / to                the SAC's asset string
``mint, admin, to``  (SEP-41)      null / to                null
``mint, to, asset``  (CAP-67)      null / to                asset
``mint, admin, to, asset``  (SAC)  null / to                asset
``burn, from``                     from / null              null
``burn, from, asset``              from / null              asset
``clawback, admin, from`` (SEP-41) from / null              null
``clawback, from, asset`` (CAP-67) from / null              asset
``clawback, admin, from, asset``   from / null              asset
``fee, from``  (CAP-67)            from / null              ``"native"`` (fees are XLM)
=================================  =======================  ==============================

The two three-topic mints (and clawbacks) are told apart by their last topic: an address is
SEP-41's ``[admin, to]`` (``[admin, from]``), a string CAP-67's ``[to, asset]`` (``[from, asset]``).
The admin is never part of the view: it authorised the movement, it did not send or receive it.

The value is an ``i128`` amount, or CAP-67's map ``{amount: i128, to_muxed_id: u64 | bytes |
string}`` (the recipient's memo or muxed id, carried beside the amount since an address in a topic
cannot be muxed for SAC balances). Amounts are decimal strings (a fee's is negative when it is a
refund); ``to_muxed_id`` a u64's decimal string, bytes' hex, or the string; null when absent.

Anything else (another first topic, a topic of the wrong type or count, another value) is not a
token movement: None, never an exception: a contract may emit any event under any name.
"""

from __future__ import annotations

import base64
import binascii
import functools
from collections.abc import Sequence
from typing import Any, NamedTuple

from ingestion.common.strkey import ACCOUNT, MUXED, strkey

KINDS = ("transfer", "mint", "burn", "clawback", "fee")
_MUXED_ARMS = ("u64", "bytes", "string")  # each a JSON string: decimal, hex, escaped

Transfer = dict[str, str | None]
"""``{"kind", "from", "to", "amount", "asset", "to_muxed_id"}``: a JSON object as served."""


def _address(topic: Any) -> str | None:
    if type(topic) is dict:
        found = topic.get("address")
        if type(found) is str:
            return found
    return None


def _string(topic: Any) -> str | None:
    if type(topic) is dict:
        found = topic.get("string")
        if type(found) is str:
            return found
    return None


class Movement(NamedTuple):
    """What an event's topics say of a movement: its kind, its ends and its asset (None where the
    kind has none); the value adds the amount."""

    kind: str
    sender: str | None
    receiver: str | None
    asset: str | None


def amount_of(value: Any) -> tuple[str, str | None] | None:
    """``(amount, to_muxed_id)`` of an event's value (SEP-51 JSON), or None when it holds no
    amount: an ``i128``, or a map whose ``amount`` is one (its ``to_muxed_id`` a u64, bytes or
    string; None when absent or another type)."""
    if type(value) is not dict:
        return None
    amount = value.get("i128")
    if type(amount) is str:
        return amount, None
    entries = value.get("map")
    if type(entries) is not list:
        return None
    amount = muxed = None
    for entry in entries:
        key, val = entry["key"], entry["val"]
        if type(key) is not dict or type(val) is not dict:
            continue
        name = key.get("symbol")
        if name == "amount" and amount is None:
            amount = val.get("i128")
            if amount is None:
                return None
        elif name == "to_muxed_id" and muxed is None and len(val) == 1:
            arm, muxed = next(iter(val.items()))
            if arm not in _MUXED_ARMS:
                muxed = None
    if type(amount) is not str:
        return None
    return amount, muxed


def muxed_u64(value: Any) -> int | None:
    """The ``to_muxed_id`` of a CAP-67 amount map when it is a ``u64`` (what an ``M`` address
    carries beside its account), else None."""
    entries = value.get("map") if type(value) is dict else None
    if type(entries) is not list:
        return None
    for entry in entries:
        key, val = entry.get("key"), entry.get("val")
        if type(key) is dict and key.get("symbol") == "to_muxed_id" and type(val) is dict:
            number = val.get("u64")
            return int(number) if type(number) is str and number.isdigit() else None
    return None


@functools.lru_cache(maxsize=4096)
def muxed_address(account: str, muxed_id: int) -> str | None:
    """The ``M`` strkey of the ``G`` account ``account`` with ``muxed_id`` (None: not a G strkey)."""
    try:
        raw = base64.b32decode(account)
    except (binascii.Error, ValueError):
        return None
    if len(raw) != 35 or raw[0] != ACCOUNT:
        return None
    return strkey(MUXED, raw[1:33] + muxed_id.to_bytes(8, "big"))


def movement(topics: Sequence[Any]) -> Movement | None:
    """The movement an event's topics (SEP-51 JSON) name, by the module's table, or None."""
    count = len(topics)
    if count < 2 or count > 4 or type(topics[0]) is not dict:
        return None
    kind = topics[0].get("symbol")
    if kind not in KINDS:
        return None
    sender = receiver = asset = None
    last_string = _string(topics[-1])
    if kind == "transfer":
        if count == 4:
            if last_string is None:
                return None
            asset = last_string
        elif count != 3:
            return None
        sender, receiver = _address(topics[1]), _address(topics[2])
        if sender is None or receiver is None:
            return None
    elif kind == "mint" or kind == "clawback":
        first = _address(topics[1])
        if first is None or count == 2:
            return None
        holder: str | None = first
        if count == 3 and last_string is not None:  # CAP-67 [to | from, asset]
            asset = last_string
        else:  # SEP-41 [admin, to | from], SAC before 23 [admin, to | from, asset]
            holder = _address(topics[2])
            if holder is None:
                return None
            if count == 4:
                if last_string is None:
                    return None
                asset = last_string
        if kind == "mint":
            receiver = holder
        else:
            sender = holder
    elif kind == "burn":
        sender = _address(topics[1])
        if sender is None or count == 4:
            return None
        if count == 3:
            if last_string is None:
                return None
            asset = last_string
    else:  # fee
        sender = _address(topics[1])
        if sender is None or count != 2:
            return None
        asset = "native"
    return Movement(kind, sender, receiver, asset)


def transfer_view(contract_id: str, topics: Sequence[Any], value: Any) -> Transfer | None:
    """The transfer view of an event (its topics and value as SEP-51 JSON), or None when the event
    is not a token movement (see the module's table): :func:`movement` of the topics with
    :func:`amount_of` the value.

    ``contract_id`` (the emitting contract's C strkey, or "" for none) is not part of the view: a
    non-SAC token is named by its contract, which the event carries anyway. It is taken so that a
    rule that needs it (an allow-list of token contracts) changes no caller.
    """
    moved = movement(topics)
    if moved is None:
        return None
    amount = amount_of(value)
    if amount is None:
        return None
    return view(moved, *amount)


def view(moved: Movement, amount: str, to_muxed_id: str | None) -> Transfer:
    """The transfer view's JSON object, its members in the served order."""
    return {
        "kind": moved.kind,
        "from": moved.sender,
        "to": moved.receiver,
        "amount": amount,
        "asset": moved.asset,
        "to_muxed_id": to_muxed_id,
    }
