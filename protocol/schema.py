"""Typed wire messages: one frozen dataclass per message, validated on decode.

Each message class names its ``TYPE`` (also its signing domain) and ``MAX_SIZE`` (the
largest encoding accepted, checked before msgpack sees a byte). Each field carries a
``FieldSpec`` in its dataclass metadata; decoding checks that the map has exactly the
declared keys, that every value has the declared type, and that it lies in range.
msgpack is decoded with strict limits and without ext types, so nothing from the network
is turned into anything but maps, lists, ints, strings, bytes and bools.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass
from typing import Any, ClassVar, Self

import msgpack

from protocol.errors import Reason, WireError

U64_MAX = 2**64 - 1


@dataclass(frozen=True)
class FieldSpec:
    """What one field may hold. ``kind`` is one of int, float, str, bytes, bool, list, or
    a ``Message`` subclass (a nested message, encoded as a map without ``type``)."""

    kind: type
    lo: float = 0
    hi: float = U64_MAX
    max_len: int = 0  # str/bytes: max length; list: max items
    exact_len: int | None = None
    pattern: str | None = None
    choices: tuple[str, ...] | None = None
    item: FieldSpec | None = None  # for lists

    def check(self, name: str, value: Any) -> None:
        if self.kind is int:
            if type(value) is not int:
                raise WireError(Reason.MALFORMED, f"{name}: expected int")
            if not self.lo <= value <= self.hi:
                raise WireError(Reason.MALFORMED, f"{name}: {value} not in [{self.lo}, {self.hi}]")
        elif self.kind is float:
            if type(value) is not float or not math.isfinite(value):
                raise WireError(Reason.MALFORMED, f"{name}: expected a finite float")
            if not self.lo <= value <= self.hi:
                raise WireError(Reason.MALFORMED, f"{name}: {value} not in [{self.lo}, {self.hi}]")
        elif self.kind is bool:
            if type(value) is not bool:
                raise WireError(Reason.MALFORMED, f"{name}: expected bool")
        elif self.kind in (str, bytes):
            if type(value) is not self.kind:
                raise WireError(Reason.MALFORMED, f"{name}: expected {self.kind.__name__}")
            if self.exact_len is not None and len(value) != self.exact_len:
                raise WireError(Reason.MALFORMED, f"{name}: length must be {self.exact_len}")
            if len(value) > self.max_len:
                raise WireError(Reason.MALFORMED, f"{name}: longer than {self.max_len}")
            if self.pattern is not None and not (
                isinstance(value, str) and re.fullmatch(self.pattern, value)
            ):
                raise WireError(Reason.MALFORMED, f"{name}: does not match {self.pattern}")
            if self.choices is not None and value not in self.choices:
                raise WireError(Reason.MALFORMED, f"{name}: {value!r} not one of {self.choices}")
        elif self.kind is list:
            if type(value) is not list:
                raise WireError(Reason.MALFORMED, f"{name}: expected list")
            if len(value) > self.max_len:
                raise WireError(Reason.MALFORMED, f"{name}: more than {self.max_len} items")
            assert self.item is not None
            for i, v in enumerate(value):
                self.item.check(f"{name}[{i}]", v)
        elif isinstance(self.kind, type) and issubclass(self.kind, Message):
            if type(value) is not self.kind:
                raise WireError(Reason.MALFORMED, f"{name}: expected {self.kind.__name__}")
            value.validate()
        else:  # pragma: no cover - programming error
            raise TypeError(f"unsupported field kind {self.kind}")


def spec(s: FieldSpec) -> Any:
    """Declare a dataclass field with its wire spec."""
    return dataclasses.field(metadata={"spec": s})


def u64(lo: int = 0, hi: int = U64_MAX) -> Any:
    return spec(FieldSpec(int, lo=lo, hi=hi))


def text(
    max_len: int, *, pattern: str | None = None, choices: tuple[str, ...] | None = None
) -> Any:
    return spec(FieldSpec(str, max_len=max_len, pattern=pattern, choices=choices))


def blob(max_len: int, *, exact_len: int | None = None) -> Any:
    return spec(FieldSpec(bytes, max_len=max_len, exact_len=exact_len))


def f64(lo: float, hi: float) -> Any:
    return spec(FieldSpec(float, lo=lo, hi=hi))


def nested(cls: type[Message]) -> FieldSpec:
    """The spec of a nested message (use as a ``listof`` item)."""
    return FieldSpec(cls)


def listof(item: FieldSpec, max_items: int) -> Any:
    return spec(FieldSpec(list, max_len=max_items, item=item))


def unpack_limited(data: bytes, max_size: int) -> Any:
    """msgpack-decode ``data`` after checking its size; never builds ext types."""
    if len(data) > max_size:
        raise WireError(Reason.OVERSIZED, f"{len(data)} bytes > {max_size}")

    def no_ext(code: int, _data: bytes) -> Any:
        raise WireError(Reason.MALFORMED, f"msgpack ext type {code} not allowed")

    try:
        return msgpack.unpackb(
            data,
            raw=False,
            strict_map_key=True,
            ext_hook=no_ext,
            use_list=True,
        )
    except WireError:
        raise
    except (ValueError, TypeError, msgpack.UnpackException, RecursionError) as exc:
        raise WireError(Reason.MALFORMED, f"not valid msgpack: {exc}") from exc


@dataclass(frozen=True)
class Message:
    """Base of every wire message."""

    TYPE: ClassVar[str]
    MAX_SIZE: ClassVar[int]

    @classmethod
    def specs(cls) -> dict[str, FieldSpec]:
        return {f.name: f.metadata["spec"] for f in dataclasses.fields(cls)}

    def validate(self) -> None:
        for name, s in self.specs().items():
            s.check(name, getattr(self, name))
        self.check()

    def check(self) -> None:
        """Consistency across fields; subclasses raise ``WireError(MALFORMED)``."""

    def to_obj(self) -> dict[str, Any]:
        return {name: _to_obj(getattr(self, name)) for name in self.specs()}

    def encode(self) -> bytes:
        self.validate()
        body = {"type": self.TYPE, **self.to_obj()}
        data: bytes = msgpack.packb(body, use_bin_type=True)
        if len(data) > self.MAX_SIZE:
            raise WireError(Reason.OVERSIZED, f"{self.TYPE}: {len(data)} bytes > {self.MAX_SIZE}")
        return data

    @classmethod
    def from_obj(cls, obj: Any, *, where: str = "") -> Self:
        """Build from a decoded map with exactly the declared keys, checking every value."""
        label = where or cls.TYPE
        if not isinstance(obj, dict):
            raise WireError(Reason.MALFORMED, f"{label}: expected a map")
        specs = cls.specs()
        if missing := set(specs) - set(obj):
            raise WireError(Reason.MALFORMED, f"{label}: missing fields {sorted(missing)}")
        if unknown := set(obj) - set(specs):
            raise WireError(Reason.MALFORMED, f"{label}: unknown fields {sorted(unknown)}")
        values = {name: _from_obj(s, f"{label}.{name}", obj[name]) for name, s in specs.items()}
        message = cls(**values)
        message.check()
        return message

    @classmethod
    def decode(cls, data: bytes) -> Self:
        obj = unpack_limited(data, cls.MAX_SIZE)
        if not isinstance(obj, dict):
            raise WireError(Reason.MALFORMED, f"{cls.TYPE}: expected a map")
        if obj.get("type") != cls.TYPE:
            raise WireError(Reason.WRONG_TYPE, f"expected {cls.TYPE}, got {obj.get('type')!r}")
        del obj["type"]
        return cls.from_obj(obj)


def _to_obj(value: Any) -> Any:
    if isinstance(value, Message):
        return value.to_obj()
    if isinstance(value, list):
        return [_to_obj(v) for v in value]
    return value


def _from_obj(s: FieldSpec, name: str, value: Any) -> Any:
    """Check ``value`` against ``s``, building nested messages on the way."""
    if isinstance(s.kind, type) and issubclass(s.kind, Message):
        return s.kind.from_obj(value, where=name)
    if s.kind is list and s.item is not None and issubclass(s.item.kind, Message):
        if type(value) is not list:
            raise WireError(Reason.MALFORMED, f"{name}: expected list")
        if len(value) > s.max_len:
            raise WireError(Reason.MALFORMED, f"{name}: more than {s.max_len} items")
        return [_from_obj(s.item, f"{name}[{i}]", v) for i, v in enumerate(value)]
    s.check(name, value)
    return value
