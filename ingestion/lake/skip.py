"""Skipping XDR values without decoding them: the lake reader's way past what events do not need.

XDR has no length prefix for structs or unions, so stepping over a value (a transaction set, a
ledger entry change) means walking it; but a walk that only reads lengths and discriminants, and
steps over every fixed-size part and every opaque or string at once, costs a fraction of building
stellar-sdk's objects.

The walks are compiled from stellar-sdk's generated classes, so they follow exactly the XDR the
full decode reads: each class's ``unpack`` (written by xdrgen, one regular shape per XDR construct)
is read through :mod:`ast` into a shape (struct fields in order, a union's discriminant and arms,
optional values, variable arrays, fixed and variable opaque and strings, enums), and the shapes are
turned into one Python function per type, ``skip(buf, at) -> end``. Compiled once per process, on
first use (:func:`skippers`); a construct the compiler does not recognise fails the compile, not a
read.

What a walk checks, as the full decode does: union discriminants and enum values (an unknown one
raises :class:`UnknownArm`, naming the type: a newer XDR), the limits of variable opaque and
strings, array lengths against the bytes left. Reading past the end raises ``struct.error``; the
caller checks where the walk ends. Pure: no I/O but reading stellar-sdk's own source once.
"""

from __future__ import annotations

import ast
import enum
import functools
import inspect
import struct
import textwrap
from collections.abc import Callable
from typing import Any

import attrs

Skip = Callable[[bytes, int], int]

_U32 = struct.Struct(">I").unpack_from
_I32 = struct.Struct(">i").unpack_from
_PRIMITIVE = {
    "Integer": 4,
    "UnsignedInteger": 4,
    "Float": 4,
    "Boolean": 4,
    "Hyper": 8,
    "UnsignedHyper": 8,
    "Double": 8,
}
_UNPACKER = {"unpack_int": 4, "unpack_uint": 4, "unpack_bool": 4, "unpack_float": 4}
_UNPACKER |= {"unpack_hyper": 8, "unpack_uhyper": 8, "unpack_double": 8}


class UnknownArm(ValueError):
    """A discriminant or enum value the installed XDR does not know (a newer XDR version)."""

    def __init__(self, where: str, value: int) -> None:
        # where: an enum's name ("LedgerEntryType 99"), or a union's and "V" for a version ("V7")
        space = "" if where.endswith(" V") else " "
        super().__init__(f"{where}{space}{value} is not known to this reader (a newer XDR version?)")
        self.where, self.value = where, value


class TooLong(ValueError):
    """A length past its XDR limit or past the end of the input."""


# -- shapes ------------------------------------------------------------------------------------


@attrs.frozen
class Fixed:
    size: int


@attrs.frozen
class Bytes:
    """Variable opaque or string: a length, the bytes, padding to 4."""

    limit: int


@attrs.frozen
class Enum:
    name: str
    values: frozenset[int]


@attrs.frozen
class Ref:
    name: str


@attrs.frozen
class Opt:
    item: Shape


@attrs.frozen
class Array:
    item: Shape


@attrs.frozen
class Union:
    name: str
    discriminant: Shape  # Enum, or Fixed(4) for an int
    arms: tuple[tuple[int, tuple[Shape, ...]], ...]


Shape = Fixed | Bytes | Enum | Ref | Opt | Array | Union


def _xdr() -> Any:
    from stellar_sdk import xdr  # lazy: start-up time (stellar_sdk, ~700 ms)

    return xdr


def _pad(size: int) -> int:
    return (size + 3) & ~3


def shape_of(name: str) -> tuple[Shape, ...]:
    """The fields of ``stellar_sdk.xdr.<name>`` in wire order, read from its ``unpack``.

    Raises:
        ValueError: ``unpack`` holds a construct this compiler does not know.
    """
    cls = getattr(_xdr(), name)
    if issubclass(cls, enum.IntEnum):
        return (Enum(name, frozenset(int(m) for m in cls)),)
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls.unpack)))
    function = tree.body[0]
    assert isinstance(function, ast.FunctionDef)
    return _block(name, function.body)


def _block(name: str, body: list[ast.stmt]) -> tuple[Shape, ...]:
    out: list[Shape] = []
    i = 0
    while i < len(body):
        stmt = body[i]
        i += 1
        if isinstance(stmt, ast.ImportFrom) or _is_depth_check(stmt):
            continue
        if isinstance(stmt, ast.Return | ast.Raise):
            break
        if not isinstance(stmt, ast.Assign) or not isinstance(stmt.targets[0], ast.Name):
            raise ValueError(f"{name}: unknown statement {ast.unparse(stmt)}")
        target, value = stmt.targets[0].id, stmt.value
        if target == "length" and (
            _is_call(value, "unpacker", "unpack_uint") or isinstance(value, ast.Constant)
        ):
            # length = ...; _remaining = ...; if _remaining < length: raise; x = []; for ...
            while i < len(body) and not isinstance(body[i], ast.For):
                i += 1
            loop = body[i]
            i += 1
            assert isinstance(loop, ast.For) and len(loop.body) == 1
            append = loop.body[0]
            if not (isinstance(append, ast.Expr) and isinstance(append.value, ast.Call)):
                raise ValueError(f"{name}: unknown array {ast.unparse(loop)}")
            (item,) = append.value.args
            if isinstance(value, ast.Constant):  # a fixed-length array
                out.extend([_value(name, item)] * _constant(value))
            else:
                out.append(Array(_value(name, item)))
        elif i < len(body) and _switches_on(body[i], target):
            arms: list[tuple[int, tuple[Shape, ...]]] = []
            while i < len(body) and _switches_on(body[i], target):
                branch = body[i]
                assert isinstance(branch, ast.If)
                i += 1
                for case in _cases(branch.test):
                    arms.append((case, _block(name, branch.body)))
            rest = body[i:]
            if not (len(rest) == 1 and isinstance(rest[0], ast.Raise)):
                raise ValueError(f"{name}: a union with a default arm: {ast.unparse(rest[0])}")
            out.append(Union(name, _value(name, value), tuple(arms)))
            break
        else:
            out.append(_value(name, value))
    return tuple(out)


def _is_depth_check(stmt: ast.stmt) -> bool:
    return isinstance(stmt, ast.If) and "depth_limit" in ast.unparse(stmt.test)


def _is_call(node: ast.expr, owner: str, method: str) -> bool:
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == method
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == owner
    )


def _switches_on(stmt: ast.stmt, target: str) -> bool:
    if not isinstance(stmt, ast.If) or stmt.orelse:
        return False
    test = stmt.test
    compares = test.values if isinstance(test, ast.BoolOp) else [test]
    return all(
        isinstance(c, ast.Compare) and isinstance(c.left, ast.Name) and c.left.id == target for c in compares
    )


def _cases(test: ast.expr) -> list[int]:
    compares = test.values if isinstance(test, ast.BoolOp) else [test]
    out = []
    for compare in compares:
        assert isinstance(compare, ast.Compare) and isinstance(compare.ops[0], ast.Eq)
        (right,) = compare.comparators
        if isinstance(right, ast.Attribute) and isinstance(right.value, ast.Name):
            out.append(int(getattr(getattr(_xdr(), right.value.id), right.attr)))
        else:
            out.append(int(ast.literal_eval(right)))
    return out


def _constant(node: ast.expr) -> int:
    if isinstance(node, ast.Name):
        return int(getattr(_xdr(), node.id))
    return int(ast.literal_eval(node))


def _value(name: str, node: ast.expr) -> Shape:
    """The shape ``node`` (the right side of an assignment in ``unpack``) reads."""
    if isinstance(node, ast.IfExp) and _is_call(node.test, "unpacker", "unpack_uint"):
        return Opt(_value(name, node.body))
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
        raise ValueError(f"{name}: unknown value {ast.unparse(node)}")
    owner, method = node.func.value, node.func.attr
    if not isinstance(owner, ast.Name):
        raise ValueError(f"{name}: unknown value {ast.unparse(node)}")
    if owner.id == "unpacker" and method in _UNPACKER:
        return Fixed(_UNPACKER[method])
    if owner.id == "unpacker" and method == "unpack_fopaque":
        return Fixed(_pad(_constant(node.args[0])))
    if method != "unpack":
        raise ValueError(f"{name}: unknown value {ast.unparse(node)}")
    if owner.id in _PRIMITIVE:
        return Fixed(_PRIMITIVE[owner.id])
    if owner.id == "String":
        return Bytes(_constant(node.args[1]))
    if owner.id == "Opaque":
        size, fixed = _constant(node.args[1]), ast.literal_eval(node.args[2])
        return Fixed(_pad(size)) if fixed else Bytes(size)
    return Ref(owner.id)


# -- compiling ---------------------------------------------------------------------------------


class _Compiler:
    def __init__(self) -> None:
        self.shapes: dict[str, tuple[Shape, ...]] = {}
        self.sizes: dict[str, int | None] = {}
        self.sources: list[str] = []
        self.constants: dict[str, Any] = {"U": _U32, "I": _I32, "UnknownArm": UnknownArm, "TooLong": TooLong}
        self.done: set[str] = set()
        self.pending: list[str] = []

    def shape(self, name: str) -> tuple[Shape, ...]:
        if name not in self.shapes:
            base, *bounds = name.split(":")
            self.shapes[name] = shape_of(base)[slice(*map(int, bounds))] if bounds else shape_of(base)
        return self.shapes[name]

    def size(self, shape: Shape, seen: frozenset[str] = frozenset()) -> int | None:
        """The bytes ``shape`` always takes, or None (variable, or an enum or union to check)."""
        if isinstance(shape, Fixed):
            return shape.size
        if isinstance(shape, Ref):
            if shape.name in seen:
                return None
            if shape.name not in self.sizes:
                total: int | None = 0
                for field in self.shape(shape.name):
                    part = self.size(field, seen | {shape.name})
                    total = None if part is None or total is None else total + part
                self.sizes[shape.name] = total
            return self.sizes[shape.name]
        return None

    def function(self, name: str) -> str:
        if name not in self.done:
            self.done.add(name)
            self.pending.append(name)
        return "s_" + name.replace(":", "_")

    def compile(self, roots: list[str]) -> dict[str, Skip]:
        for root in roots:
            self.function(root)
        while self.pending:
            name = self.pending.pop()
            lines = [f"def {self.function(name)}(b, p):"]
            self.fields(self.shape(name), lines, 1)
            lines.append("    return p")
            self.sources.append("\n".join(lines))
        namespace = dict(self.constants)
        exec("\n\n".join(self.sources), namespace)  # the code compiled above, from the sdk's
        return {root: namespace[self.function(root)] for root in roots}

    def fields(self, shapes: tuple[Shape, ...], lines: list[str], depth: int) -> None:
        pad = "    " * depth
        fixed = 0
        for shape in shapes:
            size = self.size(shape)
            if size is not None:
                fixed += size
                continue
            if fixed:
                lines.append(f"{pad}p += {fixed}")
                fixed = 0
            self.one(shape, lines, depth)
        if fixed:
            lines.append(f"{pad}p += {fixed}")

    def one(self, shape: Shape, lines: list[str], depth: int) -> None:
        pad = "    " * depth
        var = f"n{depth}"
        if isinstance(shape, Ref):
            target = self.shape(shape.name)
            if len(target) == 1 and isinstance(target[0], Bytes | Enum | Ref):  # a typedef: inline it
                self.one(target[0], lines, depth)
            else:
                lines.append(f"{pad}p = {self.function(shape.name)}(b, p)")
        elif isinstance(shape, Bytes):
            lines.append(f"{pad}{var} = U(b, p)[0]")
            if shape.limit < 0xFFFFFFFF:
                lines.append(
                    f"{pad}if {var} > {shape.limit}: raise TooLong(f'length {{{var}}} > {shape.limit}')"
                )
            lines.append(f"{pad}p += 4 + (({var} + 3) & ~3)")
        elif isinstance(shape, Enum):
            values = self.constant(f"V_{shape.name}", shape.values)
            lines.append(f"{pad}{var} = I(b, p)[0]")
            lines.append(f"{pad}if {var} not in {values}: raise UnknownArm('{shape.name}', {var})")
            lines.append(f"{pad}p += 4")
        elif isinstance(shape, Opt):
            lines.append(f"{pad}p += 4")
            lines.append(f"{pad}if U(b, p - 4)[0]:")
            self.fields((shape.item,), lines, depth + 1)
        elif isinstance(shape, Array):
            size = self.size(shape.item)
            lines.append(f"{pad}{var} = U(b, p)[0]")
            lines.append(f"{pad}p += 4")
            lines.append(f"{pad}if {var} > len(b) - p: raise TooLong('array of {var} past the end')")
            if size is not None:
                lines.append(f"{pad}p += {var} * {size}")
            else:
                lines.append(f"{pad}for _ in range({var}):")
                self.fields((shape.item,), lines, depth + 1)
        elif isinstance(shape, Union):
            where = f"{shape.name} V"
            resolved = self.shape(shape.discriminant.name) if isinstance(shape.discriminant, Ref) else ()
            if len(resolved) == 1 and isinstance(resolved[0], Enum):
                where = f"{shape.name}: {resolved[0].name}"
            lines.append(f"{pad}{var} = I(b, p)[0]")
            lines.append(f"{pad}p += 4")
            sizes = [self._arm_size(arm) for _, arm in shape.arms]
            if all(s is not None for s in sizes):
                table = self.constant(
                    f"Z_{shape.name}", {v: s for (v, _), s in zip(shape.arms, sizes, strict=True)}
                )
                lines.append(f"{pad}z = {table}.get({var})")
                lines.append(f"{pad}if z is None: raise UnknownArm('{where}', {var})")
                lines.append(f"{pad}p += z")
                return
            # the arms of a fixed size by a table, the others in order
            table = self.constant(
                f"Z_{shape.name}",
                {v: s for (v, _), s in zip(shape.arms, sizes, strict=True) if s is not None},
            )
            lines.append(f"{pad}z = {table}.get({var})")
            lines.append(f"{pad}if z is not None:")
            lines.append(f"{pad}    p += z")
            for value, arm in [(v, arm) for (v, arm), s in zip(shape.arms, sizes, strict=True) if s is None]:
                lines.append(f"{pad}elif {var} == {value}:")
                self.fields(arm, lines, depth + 1)
            lines.append(f"{pad}else: raise UnknownArm('{where}', {var})")
        else:  # pragma: no cover -- Fixed is summed by fields()
            raise AssertionError(shape)

    def _arm_size(self, arm: tuple[Shape, ...]) -> int | None:
        total = 0
        for field in arm:
            size = self.size(field)
            if size is None:
                return None
            total += size
        return total

    def constant(self, name: str, value: Any) -> str:
        self.constants[name] = value
        return name


@functools.cache
def skippers(*names: str) -> dict[str, Skip]:
    """``{name: skip}``, ``skip(buf, at) -> end`` the offset after the ``stellar_sdk.xdr.<name>``
    at ``at``, compiled together (types they share compiled once). ``"<name>:<start>:<stop>"``
    names fields ``start`` to ``stop`` (a slice) of a struct: a walk over part of it.

    Raises (from a skip): :class:`UnknownArm`, :class:`TooLong`, ``struct.error``.
    """
    return _Compiler().compile(list(names))
