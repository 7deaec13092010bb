"""The transfer view of Horizon's ``/payments`` records, and the addresses each record names. Pure.

A wallet that follows both Horizon and the contract-event sources (RPC, the lake) wants one shape
for "value moved": the contract-event view's ``{"kind", "from", "to", "amount", "asset",
"to_muxed_id"}``. :func:`payment_record_text` adds that view to a payment-type operation record as
a ``transfer`` field, so one consumer reads both sources.

Amounts are stroops as a decimal string, because the contract-event view's amounts are i128
stroops: Horizon's ``"10.0000000"`` (always 7 decimals for a classic asset) becomes
``"100000000"``, converted with integer arithmetic so that no amount is rounded. Assets are
``"native"`` or ``"CODE:ISSUER"``. Muxed ids stay decimal strings (uint64 is past a JavaScript
number's exact range).

Per type (Horizon's field names):

- ``payment``, ``path_payment_strict_receive``, ``path_payment_strict_send``: ``from`` to ``to``
  (the G accounts, as CAP-67's events name them: a muxed destination's id is ``to_muxed_id``;
  the M address Horizon adds as ``to_muxed`` stays in the record, and the watch list matches it),
  the *destination* amount and asset (``amount``, ``asset_*``; a path payment's ``source_*``
  fields are what left the sender, in another asset). An issuer paying out its own asset is a
  "transfer" too: Horizon's kinds, not the token contract's mint/burn.
- ``create_account``: ``funder`` to ``account``, ``starting_balance`` in native.
- ``account_merge``: ``account`` to ``into``, native, amount ``null``: the operation record does
  not carry the merged balance (only the ``account_credited`` effect does).
- ``invoke_host_function``: Horizon's ``asset_balance_changes`` when there is exactly one (its
  ``type`` is the kind: transfer, mint, burn, clawback; a mint has no ``from``, a burn no ``to``).
  With several, or none, the record gets no view: a consumer wanting each contract transfer reads
  the RPC or lake sources, which give each one as an event of its own.

A record of a failed transaction (``transaction_successful`` false, which ``include_failed``
pages carry) moved nothing, so it gets no view either.

A record whose movement fields are unusable (an amount that is not a 7-decimal number, a missing
party) gets ``"decodeError"`` instead of ``transfer``, so the record is still committed and the
problem is visible beside it. Text that is not a JSON object is returned as it came.

The addresses a record names (what a watch list is matched against): every string field, at the
top level or nested in objects and lists (``claimants[].destination`` of
``create_claimable_balance``, ``asset_balance_changes[].from``/``to``, ...), whose value has the
shape of an account, contract or muxed strkey (``G``/``C`` and 56 base32 characters, ``M`` and
69), in the record's order, depth first; ``_links`` is not read (URLs). Fields ending in
``_issuer`` are left out: an asset's issuer is not a party to a movement of it (a path's assets
included), and watching a big issuer would otherwise keep every payment in its asset. The shape is
checked, not the checksum: these are Horizon's own strings, and a watch list holds only valid
strkeys, so a malformed one could match nothing anyway.
"""

from __future__ import annotations

import re
from typing import Any

import orjson

STROOPS_PER_UNIT = 10**7
I128_MAX = 2**127 - 1
TRANSFER_TYPES = frozenset({"payment", "path_payment_strict_receive", "path_payment_strict_send"})

_AMOUNT = re.compile(r"([0-9]+)(?:\.([0-9]{1,7}))?", re.ASCII)
_ADDRESS = re.compile(r"[GC][A-Z2-7]{55}|M[A-Z2-7]{68}", re.ASCII)
_LENGTHS = (56, 69)


class UnusableRecord(ValueError):
    """A movement record's fields do not make a view (the message goes into ``decodeError``)."""


def stroops(amount: str) -> str:
    """Horizon's decimal amount (``"10.0000000"``) as stroops (``"100000000"``), exactly.

    Raises:
        UnusableRecord: not a non-negative number with at most 7 decimals within i128.
    """
    match = _AMOUNT.fullmatch(amount) if isinstance(amount, str) else None
    if match is None:
        raise UnusableRecord(f"amount {amount!r} is not a decimal with at most 7 places")
    whole, fraction = match.group(1), match.group(2) or ""
    if len(whole) > 32:  # past i128 whatever the digits; also keeps int() away from huge strings
        raise UnusableRecord(f"amount {amount!r} is out of range")
    value = int(whole) * STROOPS_PER_UNIT + int(fraction.ljust(7, "0"))
    if value > I128_MAX:
        raise UnusableRecord(f"amount {amount!r} is out of range")
    return str(value)


def asset_name(fields: dict[str, Any], prefix: str = "") -> str:
    """``"native"`` or ``"CODE:ISSUER"`` from ``{prefix}asset_type``/``_code``/``_issuer``."""
    kind = fields.get(f"{prefix}asset_type")
    if kind == "native":
        return "native"
    code, issuer = fields.get(f"{prefix}asset_code"), fields.get(f"{prefix}asset_issuer")
    credit = kind in ("credit_alphanum4", "credit_alphanum12")
    if credit and isinstance(code, str) and isinstance(issuer, str):
        return f"{code}:{issuer}"
    raise UnusableRecord(f"asset type {kind!r} with code {code!r} and issuer {issuer!r} names no asset")


def _party(record: dict[str, Any], field: str, *, required: bool = True) -> str | None:
    """The party in ``field``: the G account, as CAP-67's events name it (its M address, when
    Horizon gives one as ``{field}_muxed``, only when the account itself is missing)."""
    value = record.get(field) or record.get(f"{field}_muxed")
    if isinstance(value, str) and value:
        return value
    if required:
        raise UnusableRecord(f"{field!r} is missing")
    return None


def _muxed_id(value: Any) -> str | None:
    if value is None or value == "":
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if isinstance(value, str) and value.isascii() and value.isdigit():
        return value
    raise UnusableRecord(f"muxed id {value!r} is not a number")


def _view(kind: str, source: str | None, to: str | None, amount: str | None, asset: str,
          to_muxed_id: str | None) -> dict[str, Any]:  # fmt: skip
    return {"kind": kind, "from": source, "to": to, "amount": amount, "asset": asset,
            "to_muxed_id": to_muxed_id}  # fmt: skip


def transfer_view(record: dict[str, Any]) -> dict[str, Any] | None:
    """The view of one parsed ``/payments`` record, or None when it is not a movement.

    Raises:
        UnusableRecord: a movement whose fields make no view.
    """
    kind = record.get("type")
    if record.get("transaction_successful") is False:
        return None
    if kind in TRANSFER_TYPES:
        return _view(
            "transfer", _party(record, "from"), _party(record, "to"), stroops(record.get("amount")),  # type: ignore[arg-type]
            asset_name(record), _muxed_id(record.get("to_muxed_id")),
        )  # fmt: skip
    if kind == "create_account":
        return _view(
            "transfer", _party(record, "funder"), _party(record, "account"),
            stroops(record.get("starting_balance")), "native", None,  # type: ignore[arg-type]
        )  # fmt: skip
    if kind == "account_merge":
        return _view("transfer", _party(record, "account"), _party(record, "into"), None, "native", None)
    if kind == "invoke_host_function":
        changes = record.get("asset_balance_changes")
        if not isinstance(changes, list) or len(changes) != 1:
            return None
        change = changes[0]
        if not isinstance(change, dict) or not isinstance(change.get("type"), str):
            raise UnusableRecord("asset_balance_changes[0] has no type")
        source, to = _party(change, "from", required=False), _party(change, "to", required=False)
        if source is None and to is None:
            raise UnusableRecord("asset_balance_changes[0] names neither from nor to")
        return _view(
            change["type"], source, to, stroops(change.get("amount")),  # type: ignore[arg-type]
            asset_name(change), _muxed_id(change.get("destination_muxed_id")),
        )  # fmt: skip
    return None


def named_addresses(record: dict[str, Any]) -> tuple[str, ...]:
    """The addresses ``record`` names, by the rule in the module docstring, each once, in order."""
    found: dict[str, None] = {}
    _collect(record, found)
    return tuple(found)


def _collect(fields: dict[str, Any], found: dict[str, None]) -> None:
    for field, value in fields.items():
        kind = type(value)
        # the cheap tests first: most fields are links, numbers, hashes and amounts
        if kind is str:
            if (
                len(value) in _LENGTHS and value[0] in "GCM" and _ADDRESS.fullmatch(value)
                and not field.endswith("_issuer")
            ):  # fmt: skip
                found[value] = None
        elif kind is dict:
            if field != "_links":
                _collect(value, found)
        elif kind is list:
            for item in value:
                if type(item) is dict:
                    _collect(item, found)
                elif type(item) is str and len(item) in _LENGTHS and _ADDRESS.fullmatch(item):
                    found[item] = None


def payment_record_text(text: str, names: bool = True) -> tuple[str, tuple[str, ...]]:
    """One ``/payments`` record's compact JSON text as the node commits it -> (the text with
    ``,"transfer":{...}`` inserted before its final ``}`` when the record is a movement, or
    ``,"decodeError":"..."`` when it is a movement whose fields make no view, else unchanged;
    the addresses the record names).

    Never raises: text that is not a JSON object comes back unchanged, naming no address. A record
    that already has a ``transfer`` (or ``decodeError``) field comes back unchanged, so applying
    this twice is applying it once. With ``names`` false (no watch list to match) the addresses
    are not looked for: ``()``.
    """
    try:
        record = orjson.loads(text)
    except orjson.JSONDecodeError:
        return text, ()
    if not isinstance(record, dict):
        return text, ()
    addresses = named_addresses(record) if names else ()
    if "transfer" in record or "decodeError" in record:
        return text, addresses
    try:
        view = transfer_view(record)
    except UnusableRecord as exc:
        field = b'"decodeError":' + orjson.dumps(f"{record.get('type')}: {exc}")
    else:
        if view is None:
            return text, addresses
        field = b'"transfer":' + orjson.dumps(view)
    end = text.rindex("}")  # a non-empty object: it has a field, so a comma goes before ours
    return f"{text[:end]},{field.decode()}{text[end:]}", addresses
