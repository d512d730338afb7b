"""Base classes of wire events and the registry that maps wire type -> event class.

Every event is a frozen dataclass whose class attribute `type` is its GA wire name and whose
class name is that name in CamelCase (`response.output_audio.delta` -> `ResponseOutputAudioDelta`);
`@register` checks both and files the class. Client events decode through their `wire_fields`
table; server events encode their dataclass fields and read them back by their annotations. `codec` is the only user of the registry.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from types import MappingProxyType
from typing import Any, ClassVar, Final, TypeVar

from realtime_ming.protocol.dialect import Dialect
from realtime_ming.protocol.wire import (
    JsonValue,
    WireField,
    decode_fields,
    encode_attributes,
    read_dataclass,
    to_json,
)

__all__ = ["CLIENT_EVENTS", "SERVER_EVENTS", "ClientEvent", "ServerEvent", "class_name_for", "register"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ClientEvent:
    """An event received from the client; `event_id` is the client's optional id."""

    type: ClassVar[str]
    wire_fields: ClassVar[tuple[WireField, ...]] = ()
    event_id: str | None = None

    @classmethod
    def from_wire(cls, obj: Mapping[str, Any], dialect: Dialect, event_id: str | None) -> ClientEvent:
        """Decode a JSON object whose `type` already selected this class; raises `ProtocolError`."""
        return cls(event_id=event_id, **decode_fields(obj, cls.wire_fields, dialect))

    def to_wire(self, dialect: Dialect) -> dict[str, JsonValue]:
        """The event as a client sends it (unset optional fields left out)."""
        body = encode_attributes(self, self.wire_fields, dialect, skip_none=True)
        head: dict[str, JsonValue] = {"type": self.type}
        if self.event_id is not None:
            head["event_id"] = self.event_id
        return {**head, **body}


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerEvent:
    """An event sent to the client; `codec.serialise` adds `type` and a fresh `event_id`."""

    type: ClassVar[str]

    def wire_body(self, dialect: Dialect) -> dict[str, JsonValue]:
        """All fields except `type` and `event_id`, encoded for `dialect`."""
        return {f.name: to_json(getattr(self, f.name), dialect) for f in fields(self)}

    @classmethod
    def from_wire(cls, obj: Mapping[str, Any], dialect: Dialect) -> ServerEvent:
        """The inverse of `wire_body`: each field read by its annotation (`wire.from_json`); `type` and
        `event_id` are not fields. Raises `ProtocolError` (what `decode.decode_server_event` uses)."""
        return read_dataclass(cls, obj, "", dialect)


_client_events: dict[str, type[ClientEvent]] = {}
_server_events: dict[str, type[ServerEvent]] = {}
CLIENT_EVENTS: Final[Mapping[str, type[ClientEvent]]] = MappingProxyType(_client_events)
SERVER_EVENTS: Final[Mapping[str, type[ServerEvent]]] = MappingProxyType(_server_events)

EventT = TypeVar("EventT", bound=type[ClientEvent] | type[ServerEvent])


def class_name_for(wire_type: str) -> str:
    """CamelCase class name of a wire type (`input_audio_buffer.append` -> `InputAudioBufferAppend`)."""
    words = wire_type.replace(".", "_").split("_")
    return "".join(word[:1].upper() + word[1:] for word in words)


def register(cls: EventT) -> EventT:
    """Class decorator: file an event class under its wire `type`; raises `TypeError` on misuse."""
    if not issubclass(cls, ClientEvent | ServerEvent):
        raise TypeError(f"{cls.__name__} is neither a ClientEvent nor a ServerEvent")
    registry: dict[str, Any] = _client_events if issubclass(cls, ClientEvent) else _server_events
    wire_type = cls.__dict__.get("type")
    if not isinstance(wire_type, str):
        raise TypeError(f"{cls.__name__} must define the class attribute 'type'")
    if cls.__name__ != class_name_for(wire_type):
        raise TypeError(f"{cls.__name__} must be named {class_name_for(wire_type)}")
    if wire_type in registry:
        raise TypeError(f"{wire_type!r} is already registered")
    registry[wire_type] = cls
    return cls
