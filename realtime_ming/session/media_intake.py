"""A session's media intake: the image and video rates an event's media take, and their decoding into the
model's view, ahead of the handler (on a worker thread) or on the session's own path.

`MediaIntake` keeps what it decoded and measured for the event being handled; the session calls `clear`
once the event is handled, however it ended.
"""

from __future__ import annotations

from dataclasses import replace

from ..engine.api import Content
from ..protocol.ids import IdPrefix, new_id
from ..protocol.items import ContentPart, InputVideo, ItemStatus, MessageItem
from ..protocol.mcp import McpApprovalResponseItem
from ..protocol.values import AudioFormat
from .content import (
    MeasuredClip,
    MediaLimits,
    image_params,
    measure_clip,
    media_parts,
    part_to_content,
    stored_part,
    video_parts,
)
from .conversation import StoredItem
from .mcp_calls import McpServers
from .media_rate import MediaRate

__all__ = ["MediaIntake"]


class MediaIntake:
    """The decoded media of the event being handled, and the session's media rates."""

    def __init__(self, limits: MediaLimits) -> None:
        self.limits = limits
        self.predecoded: dict[int, Content | Exception] = {}  # id(part) -> its model view (`predecode`)
        self._measured: dict[int, MeasuredClip | Exception] = {}  # id(part) -> an input_video clip's span
        self._rate = MediaRate(limits)  # input_image parts, input_video seconds
        self._charged: object | None = None  # the event whose media `predecode` took the rates for

    def predecode(self, event: object, now: float, input_format: AudioFormat) -> None:
        """Decode the media of `event` ahead of its handler (see `Session.predecode`). An event over the image
        or video rate at `now` is not decoded (it will be refused); one within them takes its rates here,
        before its decoding, as the handlers do first."""
        if self._rate.images_refused(len(image_params(event)), now):
            return
        costs = []
        for param, part in video_parts(event):
            clip = self.measure(part, param)
            if isinstance(clip, Exception):
                return  # raised again by the handler on the session's own path
            costs.append(self._rate.clip_cost_s(clip.span_s))
        if self._rate.video_refused(costs, now):
            return
        self.admit(event, now)  # the decoding is spent on them even if the handler refuses the event
        self._charged = event
        for param, part in media_parts(event):
            try:
                self.predecoded[id(part)] = self._decode(part, param, input_format)
            except Exception as error:  # raised again by the handler on the session's own path
                self.predecoded[id(part)] = error

    def measure(self, part: InputVideo, param: str) -> MeasuredClip | Exception:
        """A clip's span (`measure_clip`), once per event: kept for the admission and the decode."""
        if id(part) not in self._measured:
            try:
                self._measured[id(part)] = measure_clip(part, param, self.limits)
            except Exception as error:
                self._measured[id(part)] = error
        return self._measured[id(part)]

    def measured(self, part: ContentPart) -> MeasuredClip | None:
        """The span `admit` measured for `part` (None for a part that is not a measured clip)."""
        clip = self._measured.get(id(part))
        return clip if isinstance(clip, MeasuredClip) else None

    def admit(self, event: object, now: float) -> None:
        """Take the session's image and video rates for the media of `event`, all or none, before any is
        decoded (the handlers' first step; done already for an event `predecode` decoded); raises
        ProtocolError `image_rate_limited` / `video_rate_limited` naming the first part over the bound (or
        the error a clip's span could not be learned with)."""
        if event is self._charged:
            return
        images = image_params(event)
        self._rate.check_images(images, now)  # before any container is probed
        clips = []
        for param, part in video_parts(event):
            clip = self.measure(part, param)
            if isinstance(clip, Exception):
                raise clip
            clips.append((param, self._rate.clip_cost_s(clip.span_s)))
        self._rate.admit(images, clips, now)

    def content(self, part: ContentPart, param: str, input_format: AudioFormat) -> Content:
        """The model's view of `part`: decoded ahead, or now; raises the error its decoding met."""
        done = self.predecoded.pop(id(part), None)
        if isinstance(done, Exception):
            raise done
        return done if done is not None else self._decode(part, param, input_format)

    def store(self, item, param: str, input_format: AudioFormat, mcp: McpServers) -> StoredItem:
        """A client item as the conversation keeps it: id and status assigned, the model's view of its media
        decoded (an approval must answer a request that waits: `McpServers.check_answer`); raises ProtocolError."""
        if isinstance(item, McpApprovalResponseItem):  # it must answer a request that waits (docs §4.2)
            mcp.check_answer(item, param)
            return StoredItem(replace(item, id=item.id or new_id(IdPrefix.ITEM)))
        item = replace(item, id=item.id or new_id(IdPrefix.ITEM), status=ItemStatus.COMPLETED)
        if not isinstance(item, MessageItem):
            return StoredItem(item)
        contents = tuple(self.content(part, f"{param}.content[{i}]", input_format) for i, part in enumerate(item.content))
        parts = tuple(stored_part(p, self.measured(p)) for p in item.content)  # clips measured by `admit`
        return StoredItem(replace(item, content=parts), contents)

    def _decode(self, part: ContentPart, param: str, input_format: AudioFormat) -> Content:
        return part_to_content(part, input_format, param, self.limits, self.measured(part))

    def clear(self) -> None:
        """The event is handled: drop what was decoded and measured for it."""
        self.predecoded.clear()
        self._measured.clear()
        self._charged = None
