"""Checked access to decoded JSON and the field tables that map typed values to wire paths.

Every `expect_*` helper raises `ProtocolError` naming the offending `param` path
(`session.audio.input.format.rate`, `item.content[0].text`): wrong JSON types are
`invalid_event`, well-typed but unacceptable values are `invalid_value`. A `WireField` table
drives both decoding and encoding of one object, so the two directions cannot drift apart.
`to_json` writes typed values; `from_json` reads them back by their type annotation.
"""

from __future__ import annotations

import json
import math
import types
import typing
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import MISSING, dataclass, fields, is_dataclass
from enum import StrEnum
from typing import Any, Final, Generic, TypeAlias, TypeVar

from realtime_ming.protocol.dialect import Dialect, content_type_from_wire
from realtime_ming.protocol.error_codes import ErrorCode
from realtime_ming.protocol.errors import MAX_QUOTE_CHARS, ProtocolError, clip
from realtime_ming.protocol.limits import MAX_ID_CHARS, MAX_TEXT_CHARS

__all__ = [
    "BOOL",
    "ID",
    "INT64_MAX",
    "NON_NEGATIVE_INT",
    "STRING",
    "TEXT",
    "Codec",
    "JsonValue",
    "WireField",
    "decode_fields",
    "encode_attributes",
    "encode_fields",
    "enum_codec",
    "expect_bool",
    "expect_bounded_json",
    "expect_choice",
    "expect_int",
    "expect_list",
    "expect_number",
    "expect_object",
    "expect_str",
    "expect_text",
    "from_json",
    "invalid_value",
    "join",
    "nullable",
    "number_codec",
    "quote",
    "read_dataclass",
    "text_codec",
    "to_json",
]

JsonValue: TypeAlias = None | bool | int | float | str | list["JsonValue"] | dict[str, "JsonValue"]

T = TypeVar("T")
E = TypeVar("E", bound=StrEnum)

_MISSING: Final = object()
INT64_MAX: Final = 2**63 - 1  # integer fields take at most a signed 64-bit value

_JSON_TYPE_NAMES: Final = {
    type(None): "null",
    bool: "a boolean",
    int: "an integer",
    float: "a number",
    str: "a string",
    list: "an array",
    dict: "an object",
}


def join(path: str, key: str | int) -> str:
    """Extend a param path with an object key or an array index."""
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


def _wrong_type(value: object, param: str, expected: str) -> ProtocolError:
    got = _JSON_TYPE_NAMES.get(type(value), type(value).__name__)
    return ProtocolError(
        ErrorCode.INVALID_EVENT, param=param, detail=f"'{param}' must be {expected}, got {got}"
    )


def invalid_value(param: str, detail: str) -> ProtocolError:
    """A well-typed value that is out of range or not one of the allowed choices."""
    return ProtocolError(ErrorCode.INVALID_VALUE, param=param, detail=detail)


def quote(text: str) -> str:
    """Client text as quoted inside an error detail: `'text'`, cut to a few dozen characters."""
    return f"'{clip(text, MAX_QUOTE_CHARS)}'"


def expect_str(value: object, param: str) -> str:
    """Return `value` if it is a JSON string."""
    if not isinstance(value, str):
        raise _wrong_type(value, param, "a string")
    return value


def expect_text(value: object, param: str, max_chars: int, *, single_line: bool = False) -> str:
    """Return `value` if it is a string of at most `max_chars` characters (`single_line`: no tab,
    newline or carriage return either). Other control characters and lone surrogates never get
    here: `limits.check_json` refused the whole frame."""
    text = expect_str(value, param)
    if len(text) > max_chars:
        raise ProtocolError(
            ErrorCode.STRING_ABOVE_MAX_LENGTH, param=param, length=len(text), max_length=max_chars
        )
    if single_line and ("\n" in text or "\r" in text or "\t" in text):
        raise ProtocolError(
            ErrorCode.INVALID_TEXT, param=param, detail=f"'{param}' must be one line without tabs"
        )
    return text


def expect_bounded_json(value: Any, param: str, max_bytes: int) -> Any:
    """Return free-form JSON `value` if its compact UTF-8 encoding takes at most `max_bytes`."""
    num_bytes = len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8"))
    if num_bytes > max_bytes:
        raise ProtocolError(ErrorCode.JSON_VALUE_TOO_LARGE, param=param, num_bytes=num_bytes, max_bytes=max_bytes)
    return value


def expect_bool(value: object, param: str) -> bool:
    """Return `value` if it is a JSON boolean."""
    if not isinstance(value, bool):
        raise _wrong_type(value, param, "a boolean")
    return value


def expect_int(value: object, param: str, *, minimum: int | None = None, maximum: int | None = None) -> int:
    """Return `value` if it is an integer (an integral float such as `300.0` is accepted) in range."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise _wrong_type(value, param, "an integer")
    _check_range(value, param, minimum, maximum)
    if not -INT64_MAX - 1 <= value <= INT64_MAX:
        raise ProtocolError(ErrorCode.INVALID_NUMBER, param=param, detail="the integer does not fit in 64 bits")
    return value


def expect_number(
    value: object, param: str, *, minimum: float | None = None, maximum: float | None = None
) -> float:
    """Return `value` as a float if it is a finite JSON number in range."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise _wrong_type(value, param, "a finite number")
    _check_range(value, param, minimum, maximum)
    return float(value)


def _check_range(value: float, param: str, minimum: float | None, maximum: float | None) -> None:
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        low = "-inf" if minimum is None else minimum
        high = "inf" if maximum is None else maximum
        raise invalid_value(param, f"{value} is outside the range [{low}, {high}]")


def expect_object(value: object, param: str) -> Mapping[str, Any]:
    """Return `value` if it is a JSON object."""
    if not isinstance(value, dict):
        raise _wrong_type(value, param, "an object")
    return value


def expect_list(value: object, param: str, max_length: int | None = None) -> list[Any]:
    """Return `value` if it is a JSON array (of at most `max_length` entries)."""
    if not isinstance(value, list):
        raise _wrong_type(value, param, "an array")
    if max_length is not None and len(value) > max_length:
        raise ProtocolError(ErrorCode.ARRAY_ABOVE_MAX_LENGTH, param=param, length=len(value), max_length=max_length)
    return value


def expect_choice(value: object, param: str, choices: Collection[str]) -> str:
    """Return `value` if it is one of the string `choices`."""
    text = expect_str(value, param)
    if text not in choices:
        raise invalid_value(param, f"{quote(text)} is not one of {', '.join(repr(c) for c in choices)}")
    return text


@dataclass(frozen=True, slots=True)
class Codec(Generic[T]):
    """How one typed value is read from (`decode(raw, param, dialect)`) and written to JSON."""

    decode: Callable[[Any, str, Dialect], T]
    encode: Callable[[T, Dialect], JsonValue]


def _identity(value: Any, _dialect: Dialect) -> Any:
    return value


STRING: Final[Codec[str]] = Codec(lambda v, p, _d: expect_str(v, p), _identity)


def text_codec(max_chars: int, *, single_line: bool = False) -> Codec[str]:
    """A string of at most `max_chars` characters (see `expect_text`)."""
    return Codec(lambda v, p, _d: expect_text(v, p, max_chars, single_line=single_line), _identity)

BOOL: Final[Codec[bool]] = Codec(lambda v, p, _d: expect_bool(v, p), _identity)
ID: Final[Codec[str]] = text_codec(MAX_ID_CHARS, single_line=True)  # ids, short names
TEXT: Final[Codec[str]] = text_codec(MAX_TEXT_CHARS)  # free text the model reads
NON_NEGATIVE_INT: Final[Codec[int]] = Codec(lambda v, p, _d: expect_int(v, p, minimum=0), _identity)


def number_codec(minimum: float, maximum: float) -> Codec[float]:
    """A float within `[minimum, maximum]`."""
    return Codec(lambda v, p, _d: expect_number(v, p, minimum=minimum, maximum=maximum), _identity)


def enum_codec(enum_type: type[E]) -> Codec[E]:
    """A string enum, written as its value."""
    choices = tuple(member.value for member in enum_type)
    return Codec(lambda v, p, _d: enum_type(expect_choice(v, p, choices)), lambda v, _d: v.value)


def nullable(codec: Codec[T]) -> Codec[T | None]:
    """`codec`, or JSON null meaning `None` (for fields where null clears or means default)."""

    def decode(value: Any, param: str, dialect: Dialect) -> T | None:
        return None if value is None else codec.decode(value, param, dialect)

    def encode(value: T | None, dialect: Dialect) -> JsonValue:
        return None if value is None else codec.encode(value, dialect)

    return Codec(decode, encode)


@dataclass(frozen=True, slots=True)
class WireField:
    """One typed attribute `name`, found at the key `path` (dotted for nested objects)."""

    name: str
    codec: Codec[Any]
    path: tuple[str, ...] = ()
    required: bool = False

    def __post_init__(self) -> None:
        if not self.path:
            object.__setattr__(self, "path", (self.name,))

    @classmethod
    def at(
        cls, name: str, codec: Codec[Any], path: str | None = None, *, required: bool = False
    ) -> WireField:
        """Build a field from a dotted `path` (default: the attribute name)."""
        return cls(name, codec, tuple(path.split(".")) if path else (name,), required)


def _lookup(obj: Mapping[str, Any], path: tuple[str, ...], param: str) -> Any:
    """Value at `path`, or `_MISSING` when a key is absent or a parent object is null."""
    value: Any = obj
    for depth, key in enumerate(path):
        if depth:
            if value is None:
                return _MISSING
            expect_object(value, param)
        param = join(param, key)
        value = value.get(key, _MISSING)
        if value is _MISSING:
            return _MISSING
    return value


def decode_fields(
    obj: Mapping[str, Any], fields: Sequence[WireField], dialect: Dialect, param: str = ""
) -> dict[str, Any]:
    """Decode the fields present in `obj`; absent optional fields are left out of the result."""
    values: dict[str, Any] = {}
    for field in fields:
        raw = _lookup(obj, field.path, param)
        field_param = ".".join(filter(None, (param, *field.path)))
        if raw is _MISSING:
            if field.required:
                raise ProtocolError(
                    ErrorCode.INVALID_EVENT,
                    param=field_param,
                    detail=f"missing required field '{field_param}'",
                )
            continue
        values[field.name] = field.codec.decode(raw, field_param, dialect)
    return values


def encode_fields(
    values: Mapping[str, Any], fields: Sequence[WireField], dialect: Dialect
) -> dict[str, JsonValue]:
    """Write the `values` that have a field in `fields` at their (possibly nested) paths."""
    wire: dict[str, Any] = {}
    for field in fields:
        if field.name not in values:
            continue
        parent = wire
        for key in field.path[:-1]:
            parent = parent.setdefault(key, {})
        parent[field.path[-1]] = field.codec.encode(values[field.name], dialect)
    return wire


def to_json(value: Any, dialect: Dialect) -> JsonValue:
    """Encode a typed value: objects with `to_wire(dialect)`, enums, dataclasses, tuples, mappings."""
    if value is None or isinstance(value, bool | int | float):
        return value
    if isinstance(value, StrEnum):
        return value.value
    if isinstance(value, str):
        return value
    to_wire = getattr(value, "to_wire", None)
    if to_wire is not None:
        return to_wire(dialect)
    if isinstance(value, Mapping):
        return {str(key): to_json(item, dialect) for key, item in value.items()}
    if isinstance(value, tuple | list):
        return [to_json(item, dialect) for item in value]
    if is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_json(getattr(value, f.name), dialect) for f in fields(value)}
    raise TypeError(f"cannot encode {type(value).__name__} as JSON")


_HINTS: Final[dict[type, dict[str, Any]]] = {}


def _hints(cls: type) -> dict[str, Any]:
    """The resolved field annotations of `cls` (the modules use postponed annotations)."""
    hints = _HINTS.get(cls)
    if hints is None:
        hints = _HINTS[cls] = typing.get_type_hints(cls)
    return hints


def read_dataclass(cls: type, obj: Mapping[str, Any], param: str, dialect: Dialect, **known: Any) -> Any:
    """Build dataclass `cls` from the keys of `obj` named like its fields (each read by its annotation);
    `known` values are taken as given. Absent fields take their defaults; a required one raises."""
    hints = _hints(cls)
    values = dict(known)
    for f in fields(cls):
        if f.name in values or not f.init:
            continue
        if f.name not in obj:
            if f.default is MISSING and f.default_factory is MISSING:
                where = join(param, f.name)
                raise ProtocolError(ErrorCode.INVALID_EVENT, param=where, detail=f"missing required field '{where}'")
            continue
        values[f.name] = from_json(obj[f.name], hints[f.name], join(param, f.name), dialect)
    return cls(**values)


def _union(value: Any, options: tuple[Any, ...], param: str, dialect: Dialect) -> Any:
    if type(None) in options:
        if value is None:
            return None
        options = tuple(o for o in options if o is not type(None))
    if len(options) == 1:
        return from_json(value, options[0], param, dialect)
    tagged = {getattr(o, "type", None): o for o in options if isinstance(o, type)}
    if None in tagged or len(tagged) != len(options):  # e.g. `int | Literal["inf"]`: try each in turn
        for option in options:
            try:
                return from_json(value, option, param, dialect)
            except ProtocolError:
                continue
        raise invalid_value(param, f"the value fits none of {len(options)} shapes")
    obj = expect_object(value, param)
    kind = content_type_from_wire(expect_str(obj.get("type"), join(param, "type")))
    if kind not in tagged:
        raise invalid_value(join(param, "type"), f"{quote(kind)} is not one of {', '.join(map(repr, tagged))}")
    return from_json(obj, tagged[kind], param, dialect)


def from_json(value: Any, annotation: Any, param: str, dialect: Dialect) -> Any:
    """Read `value` as the type `annotation` (the inverse of `wire.to_json`); raises `ProtocolError`."""
    origin = typing.get_origin(annotation)
    if origin in (types.UnionType, typing.Union):
        return _union(value, typing.get_args(annotation), param, dialect)
    if origin is typing.Literal:
        return expect_choice(value, param, typing.get_args(annotation))
    if origin is tuple:
        item_type = typing.get_args(annotation)[0]
        return tuple(from_json(v, item_type, join(param, i), dialect) for i, v in enumerate(expect_list(value, param)))
    if origin in (Mapping, dict):
        value_type = typing.get_args(annotation)[1]
        return {k: from_json(v, value_type, join(param, k), dialect) for k, v in expect_object(value, param).items()}
    if annotation is str:
        return expect_str(value, param)
    if annotation is bool:
        return expect_bool(value, param)
    if annotation is int:
        return expect_int(value, param)
    if annotation is float:
        return expect_number(value, param)
    if annotation is type(None):
        if value is not None:
            raise invalid_value(param, "must be null")
        return None
    if isinstance(annotation, type) and issubclass(annotation, StrEnum):
        return annotation(expect_choice(value, param, tuple(m.value for m in annotation)))
    from_wire = getattr(annotation, "from_wire", None)
    if from_wire is not None:
        return from_wire(value, param, dialect)
    if isinstance(annotation, type) and is_dataclass(annotation):
        return read_dataclass(annotation, expect_object(value, param), param, dialect)
    raise TypeError(f"no JSON reader for {annotation!r}")


def encode_attributes(
    obj: object, fields: Sequence[WireField], dialect: Dialect, *, skip_none: bool
) -> dict[str, JsonValue]:
    """`encode_fields` over the attributes of `obj`; `skip_none` leaves unset (`None`) ones out."""
    values = {f.name: getattr(obj, f.name) for f in fields}
    if skip_none:
        values = {name: value for name, value in values.items() if value is not None}
    return encode_fields(values, fields, dialect)
