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


def spec(s: FieldSpec, default: Any = dataclasses.MISSING) -> Any:
    """Declare a dataclass field with its wire spec (and a default for who builds one: on
    the wire every field is always there)."""
    return dataclasses.field(default=default, metadata={"spec": s})


def u64(lo: int = 0, hi: int = U64_MAX) -> Any:
    return spec(FieldSpec(int, lo=lo, hi=hi))


def text(
    max_len: int, *, pattern: str | None = None, choices: tuple[str, ...] | None = None
) -> Any:
    return spec(FieldSpec(str, max_len=max_len, pattern=pattern, choices=choices))


def blob(max_len: int, *, exact_len: int | None = None, default: Any = dataclasses.MISSING) -> Any:
    return spec(FieldSpec(bytes, max_len=max_len, exact_len=exact_len), default)


def f64(lo: float, hi: float) -> Any:
    return spec(FieldSpec(float, lo=lo, hi=hi))


def nested(cls: type[Message]) -> FieldSpec:
    """The spec of a nested message (use as a ``listof`` item)."""
    return FieldSpec(cls)


def listof(item: FieldSpec, max_items: int) -> Any:
    return spec(FieldSpec(list, max_len=max_items, item=item))


@dataclass(frozen=True)
class Shape:
    """The most a valid encoding can hold, enforced while msgpack decodes (``unpack_limited``:
    an envelope). Without it, bytes within the size limit but made of tiny containers
    (48 MiB of empty maps in an array) decoded into gigabytes of objects before any check."""

    map_keys: int  # keys in one map
    list_items: int  # items in one list
    text: int  # characters in one string (map keys included)
    blob: int  # bytes in one byte string
    containers: int  # maps and lists in the whole message


def unpack_limited(data: bytes, max_size: int, shape: Shape | None = None) -> Any:
    """msgpack-decode ``data`` after checking its size; never builds ext types. With
    ``shape``, a map, list, string or byte string larger than it allows, or more maps and
    lists than it allows, is refused as it is met, before it is built."""
    if len(data) > max_size:
        raise WireError(Reason.OVERSIZED, f"{len(data)} bytes > {max_size}")

    limits: dict[str, Any] = {}
    if shape is not None:
        built = [0]

        def counted(obj: Any) -> Any:
            built[0] += 1
            if built[0] > shape.containers:
                raise WireError(Reason.MALFORMED, f"more than {shape.containers} maps and lists")
            return obj

        limits = dict(
            max_map_len=shape.map_keys,
            max_array_len=shape.list_items,
            max_str_len=4 * shape.text,  # characters, up to 4 bytes each in UTF-8
            max_bin_len=shape.blob,
            object_hook=counted,
            list_hook=counted,
        )
    try:
        return msgpack.unpackb(
            data, raw=False, strict_map_key=True, ext_hook=_no_ext, use_list=True, **limits
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
    def longest(cls) -> tuple[int, int]:
        """The longest string (in characters; field names included) and the longest byte
        string any field of this message, or of a message nested in it, may hold."""
        if (known := _LONGEST.get(cls)) is None:
            known = _LONGEST[cls] = _longest(cls)
        return known

    @classmethod
    def decode(cls, data: bytes) -> Self:
        obj = read_fields(cls, data, typed=True)
        if obj.get("type") != cls.TYPE:
            raise WireError(Reason.WRONG_TYPE, f"expected {cls.TYPE}, got {obj.get('type')!r}")
        del obj["type"]
        return cls.from_obj(obj)


def read_fields(cls: type[Message], data: bytes, *, typed: bool, where: str = "") -> dict[str, Any]:
    """msgpack-decode the map of a ``cls`` message (with its ``type`` if ``typed``), led
    by its specs: each map's and list's size is checked from its header before any entry
    is read, against the fields it may have and the list's ``max_len``, and a field that
    should hold a scalar is refused a non-empty map or list. Nothing bigger than a valid
    message is built, however the bytes are arranged (``from_obj`` checks the values)."""
    if len(data) > cls.MAX_SIZE:
        raise WireError(Reason.OVERSIZED, f"{len(data)} bytes > {cls.MAX_SIZE}")
    text, blob = cls.longest()
    unpacker = msgpack.Unpacker(
        raw=False,
        strict_map_key=True,
        ext_hook=_no_ext,
        max_buffer_size=max(len(data), 1),
        max_str_len=4 * text,  # characters, up to 4 bytes each in UTF-8
        max_bin_len=blob,
        max_array_len=0,  # a scalar's place: containers are read by their headers
        max_map_len=0,
    )
    unpacker.feed(data)
    try:
        obj = _read_map(unpacker, cls, where or cls.TYPE, typed=typed)
        if unpacker.tell() != len(data):
            raise WireError(Reason.MALFORMED, f"{len(data) - unpacker.tell()} bytes after the map")
    except WireError:
        raise
    except (ValueError, TypeError, msgpack.UnpackException, RecursionError) as exc:
        raise WireError(Reason.MALFORMED, f"not valid msgpack: {exc}") from exc
    return obj


def _no_ext(code: int, _data: bytes) -> Any:
    raise WireError(Reason.MALFORMED, f"msgpack ext type {code} not allowed")


def _read_map(u: msgpack.Unpacker, cls: type[Message], name: str, *, typed: bool) -> dict[str, Any]:
    specs = cls.specs()
    most = len(specs) + typed
    try:
        n = u.read_map_header()
    except ValueError:
        raise WireError(Reason.MALFORMED, f"{name}: expected a map") from None
    if n > most:
        raise WireError(Reason.MALFORMED, f"{name}: {n} fields, at most {most}")
    obj: dict[str, Any] = {}
    for _ in range(n):
        key = u.unpack()
        if not isinstance(key, str):
            raise WireError(Reason.MALFORMED, f"{name}: a key that is not a string")
        if key in specs:
            obj[key] = _read(u, specs[key], f"{name}.{key}")
        else:  # "type", or a field it has not: from_obj names it
            obj[key] = u.unpack() if typed and key == "type" else u.skip()
    return obj


def _read(u: msgpack.Unpacker, s: FieldSpec, name: str) -> Any:
    if isinstance(s.kind, type) and issubclass(s.kind, Message):
        return _read_map(u, s.kind, name, typed=False)
    if s.kind is list:
        assert s.item is not None
        try:
            n = u.read_array_header()
        except ValueError:
            raise WireError(Reason.MALFORMED, f"{name}: expected list") from None
        if n > s.max_len:
            raise WireError(Reason.MALFORMED, f"{name}: more than {s.max_len} items")
        return [_read(u, s.item, f"{name}[{i}]") for i in range(n)]
    return u.unpack()


_LONGEST: dict[type[Message], tuple[int, int]] = {}


def _longest(cls: type[Message]) -> tuple[int, int]:
    text, blob = max(len(name) for name in [*cls.specs(), "type", getattr(cls, "TYPE", "")]), 0
    for s in cls.specs().values():
        while s.item is not None:  # a list: its items
            s = s.item
        if isinstance(s.kind, type) and issubclass(s.kind, Message):
            t, b = s.kind.longest()
            text, blob = max(text, t), max(blob, b)
        elif s.kind is str:
            text = max(text, s.max_len)
        elif s.kind is bytes:
            blob = max(blob, s.max_len)
    return text, blob


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
