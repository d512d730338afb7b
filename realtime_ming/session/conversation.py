"""The conversation of one session: ordered items, each with its client view and its model view.

A user or system item keeps the protocol item (what `conversation.item.*` events show) and, part
by part, the engine `Content` it means (16 kHz audio, decoded image, text). An assistant item
keeps its transcript/text and the audio bytes actually sent, so `truncate` can cut both.
`history()` is the engine's view of the whole conversation, oldest first.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field, replace

from ..audio import pcm
from ..engine.api import Content, ContentKind, Message, ToolCall
from ..protocol.items import (
    ConversationItem,
    FunctionCallItem,
    FunctionCallOutputItem,
    InputAudio,
    InputImage,
    ItemStatus,
    MessageItem,
    OutputAudio,
    OutputText,
    Role,
)
from ..protocol.dialect import Dialect
from ..protocol.mcp import McpCallItem
from ..protocol.values import AudioFormat
from .audio_io import encode_audio_once
from .content import content_nbytes

__all__ = ["AssistantItem", "Conversation", "StoredItem", "merge_calls"]


@dataclass
class StoredItem:
    """A client-created or committed item; `content[i]` is the model view of `item.content[i]`
    (empty for function-call items, whose model view `message()` makes from the item itself)."""

    item: ConversationItem
    content: tuple[Content, ...] = ()

    @property
    def id(self) -> str:
        """The item id."""
        assert self.item.id is not None  # ids are assigned before storing
        return self.item.id

    def view(self, *, input_format: AudioFormat | None = None) -> ConversationItem:
        """The item for events; with `input_format`, user audio is included (retrieve)."""
        if input_format is None or not isinstance(self.item, MessageItem):
            return self.item
        parts = []
        for part, content in zip(self.item.content, self.content):
            if isinstance(part, InputAudio) and content.kind is ContentKind.AUDIO:
                part = replace(part, audio=encode_audio_once(content.audio, input_format))
            parts.append(part)
        return replace(self.item, content=tuple(parts))

    @property
    def nbytes(self) -> int:
        """Memory held: the model view (audio samples, image pixels, text) plus the image URLs kept for events."""
        held = sum(content_nbytes(c) for c in self.content)
        if isinstance(self.item, MessageItem):
            held += sum(len(p.image_url) for p in self.item.content if isinstance(p, InputImage))
        elif isinstance(self.item, FunctionCallItem):
            held += len(self.item.arguments)
        elif isinstance(self.item, FunctionCallOutputItem):
            held += len(self.item.output)
        else:  # MCP items: the listed schemas, a call's arguments and output
            held += len(str(self.item.to_wire(Dialect.GA)))
        return held

    def messages(self) -> tuple[Message, ...]:
        """The engine messages of this item: an MCP call that settled is the model's call and its result (the
        output, or the error as text); the other MCP items are not shown to the model."""
        item = self.item
        if isinstance(item, McpCallItem):
            if item.output is None and item.error is None:
                return ()
            result = item.output if item.error is None else f"error: {item.error.message}"
            return (Message(Role.ASSISTANT.value, (), tool_calls=(ToolCall(item.name, item.arguments),)),
                    Message("tool", (Content.of_text(result),)))
        message = self.message()
        return () if message is None else (message,)

    def message(self) -> Message | None:
        """The engine message, or None for items the model does not see: a function call is an assistant
        message carrying the call (merged into the assistant text before it by `merge_calls`), its output
        a "tool" message; a call that did not complete (malformed, cut) is not shown to the model."""
        if isinstance(self.item, FunctionCallItem):
            if self.item.status not in (None, ItemStatus.COMPLETED):
                return None
            return Message(Role.ASSISTANT.value, (), tool_calls=(ToolCall(self.item.name, self.item.arguments),))
        if isinstance(self.item, FunctionCallOutputItem):
            return Message("tool", (Content.of_text(self.item.output),))
        if not isinstance(self.item, MessageItem) or not self.content:
            return None
        return Message(self.item.role.value, self.content)


@dataclass
class AssistantItem:
    """A model response item: its text (the transcript when spoken) and the audio sent so far."""

    id: str
    is_audio: bool
    text: str = ""
    audio: bytearray = field(default_factory=bytearray)
    codec: pcm.AudioFormat | None = None  # wire format of `audio`
    status: ItemStatus = ItemStatus.IN_PROGRESS

    @property
    def audio_ms(self) -> float:
        """Duration of the audio sent for this item."""
        return self.codec.duration_ms(len(self.audio)) if self.codec is not None else 0.0

    @property
    def nbytes(self) -> int:
        """Memory held: the audio sent and the text."""
        return len(self.audio) + len(self.text)

    def view(self, *, with_audio: bool = False, empty: bool = False) -> MessageItem:
        """The item for events; `empty` gives the `in_progress` shape of `.added` events."""
        if self.is_audio:
            audio = pcm.b64encode_audio(bytes(self.audio)) if with_audio and self.audio else None
            part: OutputAudio | OutputText = OutputAudio(transcript="" if empty else self.text, audio=audio)
        else:
            part = OutputText("" if empty else self.text)
        return MessageItem(
            role=Role.ASSISTANT, content=() if empty else (part,), id=self.id, status=self.status
        )

    def truncate(self, audio_end_ms: int) -> None:
        """Keep only the first `audio_end_ms` of audio and the matching share of the transcript.

        The engine gives no word timing, so the transcript is cut in proportion to the audio
        kept (at a word boundary), which is what the model then sees in later turns.
        """
        assert self.codec is not None
        total_ms = self.audio_ms
        keep_samples = round(audio_end_ms * self.codec.sample_rate_hz / 1000)
        del self.audio[keep_samples * self.codec.bytes_per_sample :]
        if total_ms > 0 and audio_end_ms < total_ms:
            cut = int(len(self.text) * audio_end_ms / total_ms)
            space = self.text.rfind(" ", 0, cut + 1)
            self.text = self.text[: space if space > 0 else cut].rstrip()
        self.status = ItemStatus.INCOMPLETE

    def message(self) -> Message | None:
        """The engine message (text only: the model re-reads its own words, not its audio)."""
        if self.status is ItemStatus.IN_PROGRESS or not self.text:
            return None
        return Message(Role.ASSISTANT.value, (Content.of_text(self.text),))


Entry = StoredItem | AssistantItem


class Conversation:
    """Ordered items by id, at most `max_items` holding at most `max_bytes` (`nbytes` of every entry);
    `evict` drops the oldest beyond either bound."""

    def __init__(self, max_items: int, max_bytes: int | None = None) -> None:
        self._items: OrderedDict[str, Entry] = OrderedDict()
        self._max_items = max_items
        self.max_bytes = max_bytes

    @property
    def nbytes(self) -> int:
        """Memory held by every entry."""
        return sum(entry.nbytes for entry in self._items.values())

    def evict(self, keep: tuple[str | None, ...] = ()) -> list[str]:
        """Drop the oldest items until both bounds hold, never one in `keep` nor the newest; their ids."""
        dropped: list[str] = []
        held = self.nbytes
        spared = (*keep, self.last_id())
        for item_id in list(self._items):
            over_bytes = self.max_bytes is not None and held > self.max_bytes
            if len(self._items) <= self._max_items and not over_bytes:
                break
            if item_id not in spared:
                held -= self._items.pop(item_id).nbytes
                dropped.append(item_id)
        return dropped

    def __contains__(self, item_id: str) -> bool:
        return item_id in self._items

    def __len__(self) -> int:
        return len(self._items)

    def get(self, item_id: str) -> Entry | None:
        """The entry with `item_id`, if present."""
        return self._items.get(item_id)

    def last_id(self) -> str | None:
        """Id of the newest item."""
        return next(reversed(self._items), None)

    def insert(self, entry: Entry, previous_item_id: str | None = None) -> str | None:
        """Add `entry` after `previous_item_id` (`"root"` = first, None = last).

        Returns the id of the item now before it (None at the start). Raises KeyError when
        `previous_item_id` is unknown. The bounds are applied by `evict`.
        """
        if previous_item_id is None or previous_item_id == self.last_id():
            previous = self.last_id()
            self._items[entry.id] = entry
        else:
            if previous_item_id != "root" and previous_item_id not in self._items:
                raise KeyError(previous_item_id)
            previous = None if previous_item_id == "root" else previous_item_id
            old = list(self._items.items())
            at = 0 if previous is None else [k for k, _ in old].index(previous) + 1
            old.insert(at, (entry.id, entry))
            self._items = OrderedDict(old)
        return previous

    def newest_first(self) -> list[Entry]:
        """Every entry, newest first."""
        return list(reversed(self._items.values()))

    def delete(self, item_id: str) -> bool:
        """Remove an item; False when absent."""
        return self._items.pop(item_id, None) is not None

    def history(self) -> tuple[Message, ...]:
        """Engine messages of every item the model sees, oldest first (calls merged into their turn)."""
        return merge_calls(m for entry in self._items.values()
                           for m in (entry.messages() if isinstance(entry, StoredItem) else (entry.message(),)))


def merge_calls(messages) -> tuple[Message, ...]:
    """Messages without the Nones, each function call appended to the assistant message right before it
    (its text, or earlier calls of the same turn), as the chat template renders one assistant turn."""
    out: list[Message] = []
    for message in messages:
        if message is None:
            continue
        last = out[-1] if out else None
        if message.tool_calls and not message.content and last is not None and last.role == Role.ASSISTANT.value:
            out[-1] = Message(last.role, last.content, last.tool_calls + message.tool_calls)
        else:
            out.append(message)
    return tuple(out)
