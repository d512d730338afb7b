"""The `conversation.item.*` client events of a session: create, retrieve, delete, truncate (`ItemEvents`).

The conversation owns its items; `ItemEvents` checks each event against it and tells the collaborators an edit
concerns: a waiting speculative turn goes stale, a truncated reply stops its response and its playback clock,
an answered MCP approval runs its call.
"""

from __future__ import annotations

from collections.abc import Callable

from ..protocol import client_events as ce
from ..protocol.error_codes import ErrorCode
from ..protocol.mcp import McpApprovalResponseItem
from ..protocol.responses import StatusReason
from ..protocol.server_events import (
    ConversationItemAdded,
    ConversationItemDeleted,
    ConversationItemDone,
    ConversationItemRetrieved,
    ConversationItemTruncated,
)
from ..protocol.session import SessionConfig
from .actions import Action, Send, error_reply
from .conversation import AssistantItem, Conversation
from .lifecycle import Responses
from .mcp_calls import McpServers
from .media_intake import MediaIntake
from .playout import Playout
from .speculative import Speculation
from .transcription import Transcriber

__all__ = ["ItemEvents"]


class ItemEvents:
    """The `conversation.item.*` handlers of one session. `config` gives the session's current configuration."""

    def __init__(self, *, conversation: Conversation, config: Callable[[], SessionConfig], intake: MediaIntake,
                 mcp: McpServers, responses: Responses, playout: Playout, speculation: Speculation,
                 transcriber: Transcriber) -> None:
        self._conversation, self._config, self._intake, self._mcp = conversation, config, intake, mcp
        self._responses, self._playout, self._speculation = responses, playout, speculation
        self._transcriber = transcriber

    def on_create(self, event: ce.ConversationItemCreate, now: float) -> list[Action]:
        self._intake.admit(event, now)  # first, as `predecode` charges before it decodes
        item, conversation = event.item, self._conversation
        if item.id is not None and item.id in conversation:
            return error_reply(ErrorCode.DUPLICATE_ITEM_ID, event.event_id, param="item.id", item_id=item.id)
        previous = event.previous_item_id
        if previous is not None and previous != "root" and previous not in conversation:
            return error_reply(
                ErrorCode.ITEM_CREATE_INVALID_PREVIOUS_ITEM_ID, event.event_id, param="previous_item_id",
                item_id=previous,
            )
        stored = self._intake.store(item, "item", self._config().input_format, self._mcp)
        max_bytes = self._intake.limits.max_conversation_bytes
        if stored.nbytes > max_bytes:
            return error_reply(ErrorCode.ITEM_TOO_LARGE, event.event_id, param="item", num_bytes=stored.nbytes,
                               max_bytes=max_bytes)
        actions = self._speculation.discard()
        previous_id = conversation.insert(stored, previous)
        view = stored.view()
        actions += [
            Send(ConversationItemAdded(item=view, previous_item_id=previous_id)),
            Send(ConversationItemDone(item=view, previous_item_id=previous_id)),
        ] + self._responses.evict(stored.id)
        if isinstance(view, McpApprovalResponseItem):  # approved: the call runs now
            actions += self._mcp.on_answer(view)
        return actions

    def on_retrieve(self, event: ce.ConversationItemRetrieve, now: float) -> list[Action]:
        entry = self._conversation.get(event.item_id)
        if entry is None:
            return error_reply(
                ErrorCode.ITEM_RETRIEVE_INVALID_ITEM_ID, event.event_id, param="item_id", item_id=event.item_id
            )
        if isinstance(entry, AssistantItem):
            view = entry.view(with_audio=True)
        else:
            view = entry.view(input_format=self._config().input_format)
        return [Send(ConversationItemRetrieved(item=view))]

    def on_delete(self, event: ce.ConversationItemDelete, now: float) -> list[Action]:
        if not self._conversation.delete(event.item_id):
            return error_reply(
                ErrorCode.ITEM_DELETE_INVALID_ITEM_ID, event.event_id, param="item_id", item_id=event.item_id
            )
        actions = self._speculation.discard() + self._transcriber.forget_item(event.item_id)
        return actions + [Send(ConversationItemDeleted(item_id=event.item_id))]

    def on_truncate(self, event: ce.ConversationItemTruncate, now: float) -> list[Action]:
        entry = self._conversation.get(event.item_id)
        if entry is None:
            return error_reply(
                ErrorCode.ITEM_TRUNCATE_INVALID_ITEM_ID, event.event_id, param="item_id", item_id=event.item_id
            )
        if not isinstance(entry, AssistantItem) or not entry.is_audio or event.content_index != 0:
            return error_reply(
                ErrorCode.TRUNCATE_CONTENT_INDEX_INVALID, event.event_id, param="content_index",
                item_id=event.item_id, content_index=event.content_index,
            )
        actions: list[Action] = []
        active = self._responses.active
        if active is not None and active.item is entry:
            # The client stopped playing this item: the rest of its response is unwanted.
            actions += self._responses.cancel(StatusReason.CLIENT_CANCELLED, now)
        duration_ms = entry.audio_ms
        if event.audio_end_ms > duration_ms + 1.0:  # 1 ms: clients round the played time up
            return actions + error_reply(
                ErrorCode.TRUNCATE_AUDIO_END_MS_INVALID, event.event_id, param="audio_end_ms",
                audio_end_ms=event.audio_end_ms, duration_ms=int(duration_ms), item_id=event.item_id,
            )
        entry.truncate(min(event.audio_end_ms, int(duration_ms)))
        self._playout.client_stopped(entry.id, event.audio_end_ms, now)  # the client stopped playing it there
        actions += self._speculation.discard()
        return actions + [
            Send(ConversationItemTruncated(
                item_id=event.item_id, content_index=event.content_index, audio_end_ms=event.audio_end_ms
            ))
        ]
