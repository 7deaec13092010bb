"""The ScVal decoder against stellar-sdk's ``to_json_dict`` (the reference), on random values of
every arm, and its errors on malformed input."""

from __future__ import annotations

import base64
import random
import struct

import orjson
import pytest
from stellar_sdk import StrKey, scval, xdr

from ingestion.common.strkey import base32, strkey
from ingestion.decode import scval as decoder
from ingestion.decode.scval import ScValError, decode, from_base64, from_bytes, i128_of

T = xdr.SCValType
SEED = 20_251_204


def _u64(r: random.Random) -> int:
    return r.choice([0, 1, 2**32 - 1, 2**32, 2**63 - 1, 2**63, 2**64 - 1, r.getrandbits(64)])


def _i64(r: random.Random) -> int:
    return r.choice([0, -1, 1, -(2**63), 2**63 - 1, r.getrandbits(64) - 2**63])


def _raw(r: random.Random, limit: int) -> bytes:
    """Bytes that exercise SEP-51's escaping: printable ASCII, the named escapes, the rest."""
    size = r.choice([0, 1, 3, 4, 5, r.randrange(limit + 1)])
    alphabet = [r.randrange(256), r.randrange(0x20, 0x7F), 0, 9, 10, 13, 92, 34, 0x7F, 0xFF]
    return bytes(r.choice(alphabet) for _ in range(min(size, limit)))


def random_address(r: random.Random) -> xdr.SCAddress:
    a = xdr.SCAddressType
    kind = r.randrange(5)
    key = r.randbytes(32)
    if kind == 0:
        public = xdr.PublicKey(xdr.PublicKeyType.PUBLIC_KEY_TYPE_ED25519, ed25519=xdr.Uint256(key))
        return xdr.SCAddress(a.SC_ADDRESS_TYPE_ACCOUNT, account_id=xdr.AccountID(public))
    if kind == 1:
        return xdr.SCAddress(a.SC_ADDRESS_TYPE_CONTRACT, contract_id=xdr.ContractID(xdr.Hash(key)))
    if kind == 2:
        muxed = xdr.MuxedEd25519Account(id=xdr.Uint64(_u64(r)), ed25519=xdr.Uint256(key))
        return xdr.SCAddress(a.SC_ADDRESS_TYPE_MUXED_ACCOUNT, muxed_account=muxed)
    if kind == 3:
        balance = xdr.ClaimableBalanceID(
            xdr.ClaimableBalanceIDType.CLAIMABLE_BALANCE_ID_TYPE_V0, v0=xdr.Hash(key)
        )
        return xdr.SCAddress(a.SC_ADDRESS_TYPE_CLAIMABLE_BALANCE, claimable_balance_id=balance)
    return xdr.SCAddress(a.SC_ADDRESS_TYPE_LIQUIDITY_POOL, liquidity_pool_id=xdr.PoolID(xdr.Hash(key)))


def _entries(r: random.Random, depth: int) -> xdr.SCMap:
    return xdr.SCMap(
        [
            xdr.SCMapEntry(random_scval(r, depth + 1), random_scval(r, depth + 1))
            for _ in range(r.randrange(4))
        ]
    )


def random_scval(r: random.Random, depth: int = 0) -> xdr.SCVal:
    """Any SCVal stellar-sdk can render (an absent vec or map it cannot: tested apart)."""
    kinds = list(range(23)) if depth < 4 else [k for k in range(23) if k not in (16, 17, 19)]
    kind = r.choice(kinds)
    t = T(kind)
    if kind == 0:
        return xdr.SCVal(t, b=r.random() < 0.5)
    if kind in (1, 20):
        return xdr.SCVal(t)
    if kind == 2:
        error_type = xdr.SCErrorType(r.randrange(10))
        if error_type == xdr.SCErrorType.SCE_CONTRACT:
            error = xdr.SCError(error_type, contract_code=xdr.Uint32(r.getrandbits(32)))
        else:
            error = xdr.SCError(error_type, code=xdr.SCErrorCode(r.randrange(10)))
        return xdr.SCVal(t, error=error)
    if kind == 3:
        return xdr.SCVal(t, u32=xdr.Uint32(r.choice([0, 2**32 - 1, r.getrandbits(32)])))
    if kind == 4:
        return xdr.SCVal(t, i32=xdr.Int32(r.choice([0, -(2**31), 2**31 - 1, r.getrandbits(32) - 2**31])))
    if kind == 5:
        return xdr.SCVal(t, u64=xdr.Uint64(_u64(r)))
    if kind == 6:
        return xdr.SCVal(t, i64=xdr.Int64(_i64(r)))
    if kind == 7:
        return xdr.SCVal(t, timepoint=xdr.TimePoint(xdr.Uint64(_u64(r))))
    if kind == 8:
        return xdr.SCVal(t, duration=xdr.Duration(xdr.Uint64(_u64(r))))
    if kind == 9:
        return xdr.SCVal(t, u128=xdr.UInt128Parts(hi=xdr.Uint64(_u64(r)), lo=xdr.Uint64(_u64(r))))
    if kind == 10:
        return xdr.SCVal(t, i128=xdr.Int128Parts(hi=xdr.Int64(_i64(r)), lo=xdr.Uint64(_u64(r))))
    if kind == 11:
        parts = [xdr.Uint64(_u64(r)) for _ in range(4)]
        return xdr.SCVal(t, u256=xdr.UInt256Parts(*parts))
    if kind == 12:
        parts = [xdr.Uint64(_u64(r)) for _ in range(3)]
        return xdr.SCVal(t, i256=xdr.Int256Parts(xdr.Int64(_i64(r)), *parts))
    if kind == 13:
        return xdr.SCVal(t, bytes=xdr.SCBytes(r.randbytes(r.choice([0, 1, 4, 7, 32, 65]))))
    if kind == 14:
        return xdr.SCVal(t, str=xdr.SCString(_raw(r, 70)))
    if kind == 15:
        return xdr.SCVal(t, sym=xdr.SCSymbol(_raw(r, 32)))
    if kind == 16:
        return xdr.SCVal(t, vec=xdr.SCVec([random_scval(r, depth + 1) for _ in range(r.randrange(5))]))
    if kind == 17:
        return xdr.SCVal(t, map=_entries(r, depth))
    if kind == 18:
        return xdr.SCVal(t, address=random_address(r))
    if kind == 19:
        e = xdr.ContractExecutableType(r.randrange(3))
        if e == xdr.ContractExecutableType.CONTRACT_EXECUTABLE_WASM:
            executable = xdr.ContractExecutable(e, wasm_hash=xdr.Hash(r.randbytes(32)))
        elif e == xdr.ContractExecutableType.CONTRACT_EXECUTABLE_STELLAR_ASSET:
            executable = xdr.ContractExecutable(e)
        else:
            ref = xdr.ContractExecutableExternalRef(random_address(r), xdr.SCString(_raw(r, 20)))
            executable = xdr.ContractExecutable(e, external_ref=ref)
        storage = _entries(r, depth) if r.random() < 0.7 else None
        return xdr.SCVal(t, instance=xdr.SCContractInstance(executable, storage))
    if kind == 21:
        return xdr.SCVal(t, nonce_key=xdr.SCNonceKey(xdr.Int64(_i64(r))))
    return xdr.SCVal(t, executable_tag=xdr.SCString(_raw(r, 20)))


def test_random_scvals_of_every_arm_decode_as_stellar_sdk_renders_them() -> None:
    r = random.Random(SEED)
    arms: set[int] = set()
    for _ in range(4000):
        value = random_scval(r)
        arms.add(value.type.value)
        text = value.to_xdr()
        expected = value.to_json_dict()
        assert from_base64(text) == expected, text
        got = decode(text)
        assert got.json == expected and orjson.loads(got.text) == expected
        assert got.text == orjson.dumps(expected).decode()
    assert arms == set(range(23))


def test_extreme_integers_and_escapes_exactly() -> None:
    cases = [
        (scval.to_int128(-(2**127)), {"i128": str(-(2**127))}),
        (scval.to_int128(2**127 - 1), {"i128": str(2**127 - 1)}),
        (scval.to_uint128(2**128 - 1), {"u128": str(2**128 - 1)}),
        (scval.to_int256(-(2**255)), {"i256": str(-(2**255))}),
        (scval.to_uint256(2**256 - 1), {"u256": str(2**256 - 1)}),
        (scval.to_int64(-(2**63)), {"i64": str(-(2**63))}),
        (scval.to_uint64(2**64 - 1), {"u64": str(2**64 - 1)}),
        (scval.to_int32(-(2**31)), {"i32": -(2**31)}),
        (
            scval.to_string(b'a"b\\c\x00\t\n\r\x7f\xff\xc3\xa9'),
            {"string": 'a"b\\\\c\\0\\t\\n\\r\\x7f\\xff\\xc3\\xa9'},
        ),
        (scval.to_symbol("transfer"), {"symbol": "transfer"}),
        (scval.to_bytes(b"\x00\xab"), {"bytes": "00ab"}),
        (scval.to_void(), "void"),
    ]
    for value, expected in cases:
        assert value.to_json_dict() == expected
        assert from_base64(value.to_xdr()) == expected


def test_strkeys_of_every_address_kind_match_stellar_sdk() -> None:
    r = random.Random(SEED)
    for _ in range(300):
        key, muxed_id = r.randbytes(32), r.getrandbits(64)
        assert strkey(decoder.ACCOUNT, key) == StrKey.encode_ed25519_public_key(key)
        assert strkey(decoder.CONTRACT, key) == StrKey.encode_contract(key)
        assert strkey(decoder.LIQUIDITY_POOL, key) == StrKey.encode_liquidity_pool(key)
        assert strkey(decoder.CLAIMABLE_BALANCE, b"\0" + key) == StrKey.encode_claimable_balance(b"\0" + key)
        muxed = key + muxed_id.to_bytes(8, "big")
        assert strkey(decoder.MUXED, muxed) == StrKey.encode_med25519_public_key(muxed)
    for size in range(1, 81):
        data = r.randbytes(size)
        assert base32(data) == base64.b32encode(data).decode().rstrip("=")


def test_an_absent_vec_or_map_is_null_where_stellar_sdk_cannot_render_it() -> None:
    for kind, name in ((T.SCV_VEC, "vec"), (T.SCV_MAP, "map")):
        raw = struct.pack(">II", kind, 0)
        value = xdr.SCVal.from_xdr_bytes(raw)
        with pytest.raises(AssertionError):
            value.to_json_dict()
        assert from_bytes(raw) == {name: None}


def test_i128_short_way_agrees_with_the_decoder() -> None:
    r = random.Random(SEED)
    for _ in range(500):
        value = scval.to_int128(r.choice([0, -1, 2**127 - 1, -(2**127), r.getrandbits(128) - 2**127]))
        text = value.to_xdr()
        assert i128_of(text) == from_base64(text)["i128"]
    assert i128_of(scval.to_uint128(5).to_xdr()) is None
    assert i128_of("not base64!") is None


def _xdr(*words: int) -> bytes:
    return b"".join(struct.pack(">I", w) for w in words)


MALFORMED = [
    (b"", "truncated"),
    (_xdr(23), "unknown ScVal type 23"),
    (_xdr(0xFFFFFFFF), "unknown ScVal type 4294967295"),
    (_xdr(0, 2), "bool 2"),
    (_xdr(3, 7, 0), "4 trailing bytes after the ScVal at offset 8"),
    (_xdr(10, 0, 0, 0), "truncated"),
    (_xdr(14, 5) + b"abcde", "truncated: string needs 8 bytes"),
    (_xdr(14, 5) + b"abcde\0\0\1", "non-zero padding"),
    (_xdr(15, 33) + b"a" * 36, "symbol of 33 bytes exceeds its limit of 32"),
    (_xdr(16, 2), "optional flag 2"),
    (_xdr(16, 1, 1000), "a vec of 1000 items"),
    (_xdr(17, 1, 1000), "a map of 1000 entries"),
    (_xdr(18, 5) + b"\0" * 32, "unknown address type 5"),
    (_xdr(18, 0, 1) + b"\0" * 32, "unknown public key type 1"),
    (_xdr(18, 3, 1) + b"\0" * 32, "unknown claimable balance id type 1"),
    (_xdr(18, 1) + b"\0" * 31, "truncated: contract id"),
    (_xdr(2, 10, 0), "unknown error type 10"),
    (_xdr(2, 1, 10), "unknown error code 10"),
    (_xdr(19, 3), "unknown contract executable type 3"),
    (_xdr(16, 1, 1) * 200 + _xdr(1), "nested deeper than 128"),
]


@pytest.mark.parametrize(("raw", "message"), MALFORMED)
def test_malformed_xdr_raises_a_specific_scval_error(raw: bytes, message: str) -> None:
    with pytest.raises(ScValError, match=message):
        from_bytes(raw)


@pytest.mark.parametrize("text", ["AAAAAQ", "AAAA AQ==", "AAAAAQ==\n", "é", "AAAAAQ==AAAA", "!!!!"])
def test_text_that_is_not_strict_base64_raises_a_scval_error(text: str) -> None:
    with pytest.raises(ScValError, match="not base64"):
        from_base64(text)


def test_127_nested_vecs_decode_and_the_128th_level_is_refused() -> None:
    deepest = 128
    raw = _xdr(16, 1, 1) * (deepest - 1) + _xdr(1)
    value = from_bytes(raw)
    for _ in range(deepest - 1):
        value = value["vec"][0]
    assert value == "void"
    with pytest.raises(ScValError, match="nested deeper"):
        from_bytes(_xdr(16, 1, 1) * deepest + _xdr(1))


def test_every_truncation_and_corruption_of_valid_values_raises_only_scval_error() -> None:
    """Cut or flip random values' XDR: each result decodes (a flip can make another valid value)
    or raises ScValError, never anything else."""
    r = random.Random(SEED)
    outcomes = {"ok": 0, "error": 0}
    for _ in range(400):
        raw = random_scval(r).to_xdr_bytes()
        variants = [raw[:cut] for cut in range(len(raw))]
        for _ in range(10):
            flipped = bytearray(raw)
            flipped[r.randrange(len(raw))] ^= 1 << r.randrange(8)
            variants.append(bytes(flipped))
        variants.append(r.randbytes(r.randrange(64)))
        for variant in variants:
            try:
                from_bytes(variant)
            except ScValError:
                outcomes["error"] += 1
            else:
                outcomes["ok"] += 1
    assert outcomes["error"] > 10_000 and outcomes["ok"] > 100


def test_the_cache_answers_repeats_and_is_cleared_when_full() -> None:
    cache = decoder.DecodeCache(limit=3)
    texts = [scval.to_uint32(i).to_xdr() for i in range(4)]
    first = cache(texts[0])
    assert cache(texts[0]) is first
    for text in texts[1:3]:
        cache(text)
    assert len(cache.entries) == 3
    cache(texts[3])
    assert list(cache.entries) == [texts[3]]
    with pytest.raises(ScValError):
        cache("AAAA")
    assert list(cache.entries) == [texts[3]]
