"""Conversation items and their content parts (`docs/protocol.md` §4), typed both ways.

Items are parsed from `conversation.item.create` / `response.create` and rendered inside server
events. Audio stays a base64 string here; the session/audio layer decodes it. Assistant content
uses GA names (`output_text`, `output_audio`); `dialect.content_type_to_wire` renames them.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any, ClassVar, Final, TypeAlias, cast

from realtime_ming.protocol.dialect import Dialect, content_type_from_wire, content_type_to_wire
from realtime_ming.protocol.error_codes import ErrorCode
from realtime_ming.protocol.errors import ProtocolError
from realtime_ming.protocol.mcp import (
    McpApprovalRequestItem,
    McpApprovalResponseItem,
    McpCallItem,
    McpListToolsItem,
    decode_approval_response,
)
from realtime_ming.protocol.limits import (
    MAX_CONTENT_PARTS,
    MAX_ID_CHARS,
    MAX_INPUT_ITEMS,
    MAX_NAME_CHARS,
    MAX_TEXT_CHARS,
    MAX_VIDEO_FRAMES,
)
from realtime_ming.protocol.wire import (
    Codec,
    JsonValue,
    expect_choice,
    expect_list,
    expect_number,
    expect_object,
    expect_str,
    expect_text,
    invalid_value,
    join,
    quote,
    read_dataclass,
)

__all__ = [
    "ITEM",
    "ITEMS_OR_REFERENCES",
    "ContentPart",
    "ConversationItem",
    "FunctionCallItem",
    "FunctionCallOutputItem",
    "ImageDetail",
    "InputAudio",
    "InputImage",
    "InputText",
    "InputVideo",
    "ItemReference",
    "ItemStatus",
    "MessageItem",
    "OutputAudio",
    "OutputText",
    "Role",
    "VideoFrame",
]


class Role(StrEnum):
    """Message author."""

    SYSTEM = "system"
    USER = "user"
    ASSISTANT = "assistant"


class ItemStatus(StrEnum):
    """Item lifecycle state."""

    IN_PROGRESS = "in_progress"
    COMPLETED = "completed"
    INCOMPLETE = "incomplete"


class ImageDetail(StrEnum):
    """Requested image resolution."""

    AUTO = "auto"
    LOW = "low"
    HIGH = "high"


def _part_wire(part_type: str, dialect: Dialect, **values: str | None) -> dict[str, JsonValue]:
    wire: dict[str, JsonValue] = {"type": content_type_to_wire(part_type, dialect)}
    wire.update((key, value) for key, value in values.items() if value is not None)
    return wire


@dataclass(frozen=True, slots=True)
class InputText:
    """User or system text."""

    type: ClassVar[str] = "input_text"
    text: str

    def to_wire(self, dialect: Dialect) -> JsonValue:
        """Wire content part."""
        return _part_wire(self.type, dialect, text=self.text)


@dataclass(frozen=True, slots=True)
class InputAudio:
    """User audio: base64 in the session input format (omitted in added/done events)."""

    type: ClassVar[str] = "input_audio"
    audio: str | None = None
    transcript: str | None = None

    def to_wire(self, dialect: Dialect) -> JsonValue:
        """Wire content part; `transcript` is always there, null until the audio is transcribed (OpenAI's shape: the
        Agents JS SDK's item schema requires the key)."""
        return {**_part_wire(self.type, dialect, audio=self.audio), "transcript": self.transcript}


@dataclass(frozen=True, slots=True)
class InputImage:
    """User image as a `data:image/...;base64,...` URL (the server fetches nothing)."""

    type: ClassVar[str] = "input_image"
    image_url: str
    detail: ImageDetail | None = None

    def to_wire(self, dialect: Dialect) -> JsonValue:
        """Wire content part."""
        detail = None if self.detail is None else self.detail.value
        return _part_wire(self.type, dialect, image_url=self.image_url, detail=detail)

    @classmethod
    def from_wire(cls, value: Any, param: str, dialect: Dialect) -> InputImage | InputVideo:
        """A server frame's `input_image` part; one carrying a `video` summary is a stored `InputVideo` clip."""
        obj = expect_object(value, param)
        if "video" not in obj:
            return read_dataclass(cls, obj, param, dialect)
        where = join(param, "video")
        video = expect_object(obj["video"], where)
        frames, duration = video.get("num_frames"), video.get("duration_s")
        return InputVideo(
            num_frames=None if frames is None else int(expect_number(frames, join(where, "num_frames"))),
            duration_s=None if duration is None else float(expect_number(duration, join(where, "duration_s"))))


@dataclass(frozen=True, slots=True)
class VideoFrame:
    """One frame of an `input_video` clip: an image data URL shown from `timestamp_s` on."""

    image_url: str
    timestamp_s: float

    def to_wire(self) -> JsonValue:
        """Wire frame."""
        return {"image_url": self.image_url, "timestamp_s": self.timestamp_s}


@dataclass(frozen=True, slots=True)
class InputVideo:
    """realtime_ming extension (GA only, docs/protocol.md §4.1): a short clip for Ming's video path.

    Sent as `frames` (image data URLs with strictly increasing timestamps) or as one `video_url`
    (`data:video/...;base64,...`, decoded by the server when it has the `video` extra). Once stored,
    the payload is dropped and the part is shown in server events as an `input_image` part without
    `image_url` carrying a `video` summary (`num_frames`, `duration_s`): GA has no video content type,
    and every client that reads GA items accepts that shape.
    """

    type: ClassVar[str] = "input_video"
    frames: tuple[VideoFrame, ...] = ()
    video_url: str | None = None
    num_frames: int | None = None  # the stored summary: frames the model sees
    duration_s: float | None = None

    @property
    def has_payload(self) -> bool:
        """Whether the part still carries its frames or video bytes (a client request), not only the summary."""
        return bool(self.frames) or self.video_url is not None

    def to_wire(self, dialect: Dialect) -> JsonValue:
        """Wire content part: the request shape while it carries a payload, else the stored summary."""
        if self.has_payload:
            wire: dict[str, JsonValue] = {"type": self.type}
            if self.video_url is not None:
                wire["video_url"] = self.video_url
            else:
                wire["frames"] = [frame.to_wire() for frame in self.frames]
            return wire
        summary: dict[str, JsonValue] = {}
        if self.num_frames is not None:
            summary["num_frames"] = self.num_frames
        if self.duration_s is not None:
            summary["duration_s"] = self.duration_s
        return {"type": InputImage.type, "video": summary}


@dataclass(frozen=True, slots=True)
class OutputText:
    """Assistant text (beta: `text`)."""

    type: ClassVar[str] = "output_text"
    text: str

    def to_wire(self, dialect: Dialect) -> JsonValue:
        """Wire content part."""
        return _part_wire(self.type, dialect, text=self.text)


@dataclass(frozen=True, slots=True)
class OutputAudio:
    """Assistant audio (beta: `audio`): its transcript; base64 audio only when retrieved."""

    type: ClassVar[str] = "output_audio"
    transcript: str | None = None
    audio: str | None = None

    def to_wire(self, dialect: Dialect) -> JsonValue:
        """Wire content part."""
        return _part_wire(self.type, dialect, transcript=self.transcript, audio=self.audio)


ContentPart: TypeAlias = InputText | InputAudio | InputImage | InputVideo | OutputText | OutputAudio

_PARTS_BY_ROLE: Final[dict[Role, tuple[type[ContentPart], ...]]] = {
    Role.SYSTEM: (InputText,),
    Role.USER: (InputText, InputAudio, InputImage, InputVideo),
    Role.ASSISTANT: (OutputText, OutputAudio),
}
_PART_TYPES: Final = {
    cls.type: cls for cls in (InputText, InputAudio, InputImage, InputVideo, OutputText, OutputAudio)
}


def _opt_str(obj: Any, key: str, param: str) -> str | None:
    """An optional payload string (base64 audio: bounded by the frame size only)."""
    value = obj.get(key)
    return None if value is None else expect_str(value, join(param, key))


def _opt_text(obj: Any, key: str, param: str, max_chars: int, *, single_line: bool = False) -> str | None:
    value = obj.get(key)
    return None if value is None else expect_text(value, join(param, key), max_chars, single_line=single_line)


def _id(value: Any, param: str) -> str:
    return expect_text(value, param, MAX_ID_CHARS, single_line=True)


def _opt_id(obj: Any, key: str, param: str) -> str | None:
    return _opt_text(obj, key, param, MAX_ID_CHARS, single_line=True)


def _image_url(value: Any, param: str) -> str:
    url = expect_str(value, param)
    if not url.startswith("data:image/") or ";base64," not in url:
        raise ProtocolError(
            ErrorCode.INVALID_IMAGE,
            param=param,
            detail="image_url must be a data URL of the form data:image/<type>;base64,<data>",
        )
    return url


def _decode_image(obj: Any, param: str, dialect: Dialect) -> InputImage:
    if dialect is Dialect.BETA:
        raise invalid_value(join(param, "type"), "input_image is not part of the beta protocol")
    url = _image_url(obj.get("image_url"), join(param, "image_url"))
    detail = obj.get("detail")
    choices = tuple(d.value for d in ImageDetail)
    return InputImage(
        url, None if detail is None else ImageDetail(expect_choice(detail, join(param, "detail"), choices))
    )


def _decode_frames(value: Any, param: str) -> tuple[VideoFrame, ...]:
    raw = expect_list(value, param, MAX_VIDEO_FRAMES)
    if not raw:
        raise ProtocolError(ErrorCode.INVALID_VIDEO, param=param, detail="a clip needs at least one frame")
    frames: list[VideoFrame] = []
    for i, entry in enumerate(raw):
        frame_param = join(param, i)
        obj = expect_object(entry, frame_param)
        unknown = sorted(set(obj) - {"image_url", "timestamp_s"})
        if unknown:
            raise invalid_value(join(frame_param, unknown[0]), "a frame has only 'image_url' and 'timestamp_s'")
        url = _image_url(obj.get("image_url"), join(frame_param, "image_url"))
        stamp_param = join(frame_param, "timestamp_s")
        stamp = expect_number(obj.get("timestamp_s"), stamp_param, minimum=0.0)
        if frames and stamp <= frames[-1].timestamp_s:
            raise ProtocolError(ErrorCode.INVALID_VIDEO, param=stamp_param,
                                detail="frame timestamps must increase strictly")
        frames.append(VideoFrame(url, stamp))
    return tuple(frames)


def _decode_video(obj: Any, param: str, dialect: Dialect) -> InputVideo:
    if dialect is Dialect.BETA:
        raise invalid_value(join(param, "type"), "input_video is not part of the beta protocol")
    if ("frames" in obj) == ("video_url" in obj):
        raise ProtocolError(ErrorCode.INVALID_VIDEO, param=param,
                            detail="input_video needs exactly one of 'frames' and 'video_url'")
    if "frames" in obj:
        return InputVideo(frames=_decode_frames(obj["frames"], join(param, "frames")))
    url_param = join(param, "video_url")
    url = expect_str(obj["video_url"], url_param)
    if not url.startswith("data:video/") or ";base64," not in url:
        raise ProtocolError(ErrorCode.INVALID_VIDEO, param=url_param,
                            detail="video_url must be a data URL of the form data:video/<type>;base64,<data>")
    return InputVideo(video_url=url)


def _decode_part(value: Any, param: str, role: Role, dialect: Dialect) -> ContentPart:
    obj = expect_object(value, param)
    type_param = join(param, "type")
    part_type = content_type_from_wire(expect_str(obj.get("type"), type_param))
    cls = _PART_TYPES.get(part_type)
    if cls is None:
        raise invalid_value(type_param, f"unknown content type {quote(part_type)}")
    if cls not in _PARTS_BY_ROLE[role]:
        raise ProtocolError(
            ErrorCode.UNSUPPORTED_CONTENT, param=type_param, content_type=part_type, role=role.value
        )
    if cls is InputImage:
        return _decode_image(obj, param, dialect)
    if cls is InputVideo:
        return _decode_video(obj, param, dialect)
    if cls is InputText or cls is OutputText:
        return cls(expect_text(obj.get("text"), join(param, "text"), MAX_TEXT_CHARS))
    audio, transcript = _opt_str(obj, "audio", param), _opt_text(obj, "transcript", param, MAX_TEXT_CHARS)
    if cls is InputAudio and audio is None and transcript is None:
        raise invalid_value(param, "input_audio needs 'audio' or 'transcript'")
    return cls(audio=audio, transcript=transcript)


def _item_wire(item_type: str, item_id: str | None, status: ItemStatus | None) -> dict[str, JsonValue]:
    wire: dict[str, JsonValue] = {"type": item_type, "object": "realtime.item"}
    if item_id is not None:
        wire["id"] = item_id
    if status is not None:
        wire["status"] = status.value
    return wire


@dataclass(frozen=True, slots=True, kw_only=True)
class MessageItem:
    """A system, user or assistant message; `id`/`status` are unset until the server assigns them."""

    type: ClassVar[str] = "message"
    role: Role
    content: tuple[ContentPart, ...]
    id: str | None = None
    status: ItemStatus | None = None

    def to_wire(self, dialect: Dialect) -> JsonValue:
        """Wire item with `object: "realtime.item"`."""
        wire = _item_wire(self.type, self.id, self.status)
        wire["role"] = self.role.value
        wire["content"] = [part.to_wire(dialect) for part in self.content]
        return wire


@dataclass(frozen=True, slots=True, kw_only=True)
class FunctionCallItem:
    """A function call emitted by the model; `arguments` is a JSON string."""

    type: ClassVar[str] = "function_call"
    name: str
    arguments: str
    call_id: str | None = None
    id: str | None = None
    status: ItemStatus | None = None

    def to_wire(self, _dialect: Dialect) -> JsonValue:
        """Wire item with `object: "realtime.item"`."""
        wire = _item_wire(self.type, self.id, self.status)
        if self.call_id is not None:
            wire["call_id"] = self.call_id
        wire.update(name=self.name, arguments=self.arguments)
        return wire


@dataclass(frozen=True, slots=True, kw_only=True)
class FunctionCallOutputItem:
    """The client's result for `call_id`."""

    type: ClassVar[str] = "function_call_output"
    call_id: str
    output: str
    id: str | None = None
    status: ItemStatus | None = None

    def to_wire(self, _dialect: Dialect) -> JsonValue:
        """Wire item with `object: "realtime.item"`."""
        wire = _item_wire(self.type, self.id, self.status)
        wire.update(call_id=self.call_id, output=self.output)
        return wire


@dataclass(frozen=True, slots=True)
class ItemReference:
    """A reference to an existing item, allowed only in `response.create` `input`."""

    type: ClassVar[str] = "item_reference"
    id: str

    def to_wire(self, _dialect: Dialect) -> JsonValue:
        """Wire reference."""
        return {"type": self.type, "id": self.id}


ConversationItem: TypeAlias = (MessageItem | FunctionCallItem | FunctionCallOutputItem | McpListToolsItem | McpCallItem
                               | McpApprovalRequestItem | McpApprovalResponseItem)
# the MCP items a client may not create: the server writes them (listing tools, calling them)
_SERVER_ONLY_KINDS: Final = ("mcp_list_tools", "mcp_call", "mcp_approval_request")


def _decode_message(
    obj: Any, param: str, dialect: Dialect, item_id: str | None, status: ItemStatus | None
) -> MessageItem:
    role = Role(expect_choice(obj.get("role"), join(param, "role"), tuple(r.value for r in Role)))
    content_param = join(param, "content")
    raw_parts = expect_list(obj.get("content"), content_param, MAX_CONTENT_PARTS)
    if not raw_parts:
        raise invalid_value(content_param, "a message needs at least one content part")
    parts = tuple(
        _decode_part(part, join(content_param, i), role, dialect) for i, part in enumerate(raw_parts)
    )
    return MessageItem(role=role, content=parts, id=item_id, status=status)


def _decode_item(
    value: Any, param: str, dialect: Dialect, *, allow_reference: bool
) -> ConversationItem | ItemReference:
    obj = expect_object(value, param)
    kinds = ["message", "function_call", "function_call_output", "mcp_approval_response", *_SERVER_ONLY_KINDS] + (
        ["item_reference"] if allow_reference else []
    )
    # Beta items may omit `type`; a `role` makes them messages.
    raw_type = obj.get("type", "message" if dialect is Dialect.BETA and "role" in obj else None)
    kind = expect_choice(raw_type, join(param, "type"), kinds)
    item_id = _opt_id(obj, "id", param)
    if kind == "item_reference":
        return ItemReference(_id(obj.get("id"), join(param, "id")))
    if kind in _SERVER_ONLY_KINDS:
        raise invalid_value(join(param, "type"), f"{quote(kind)} items are written by the server (its MCP tools)")
    if kind == "mcp_approval_response":
        return decode_approval_response(obj, param, item_id)
    raw_status = obj.get("status")
    status = (
        None
        if raw_status is None
        else ItemStatus(expect_choice(raw_status, join(param, "status"), tuple(s.value for s in ItemStatus)))
    )
    if kind == "message":
        return _decode_message(obj, param, dialect, item_id, status)
    if kind == "function_call":
        return FunctionCallItem(
            name=expect_text(obj.get("name"), join(param, "name"), MAX_NAME_CHARS, single_line=True),
            arguments=expect_text(obj.get("arguments"), join(param, "arguments"), MAX_TEXT_CHARS),
            call_id=_opt_id(obj, "call_id", param),
            id=item_id,
            status=status,
        )
    return FunctionCallOutputItem(
        call_id=_id(obj.get("call_id"), join(param, "call_id")),
        output=expect_text(obj.get("output"), join(param, "output"), MAX_TEXT_CHARS),
        id=item_id,
        status=status,
    )


def _decode_conversation_item(value: Any, param: str, dialect: Dialect) -> ConversationItem:
    # allow_reference=False keeps `item_reference` out of the accepted kinds.
    return cast(ConversationItem, _decode_item(value, param, dialect, allow_reference=False))


def _decode_items(value: Any, param: str, dialect: Dialect) -> tuple[ConversationItem | ItemReference, ...]:
    return tuple(
        _decode_item(item, join(param, i), dialect, allow_reference=True)
        for i, item in enumerate(expect_list(value, param, MAX_INPUT_ITEMS))
    )


ITEM: Final[Codec[ConversationItem]] = Codec(_decode_conversation_item, lambda v, d: v.to_wire(d))
# `response.create` `input`: out-of-band items and references to existing items.
ITEMS_OR_REFERENCES: Final[Codec[tuple[ConversationItem | ItemReference, ...]]] = Codec(
    _decode_items, lambda v, d: [item.to_wire(d) for item in v]
)
