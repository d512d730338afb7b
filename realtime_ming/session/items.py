"""The `conversation.item.*` client events of a `Session`: create, retrieve, delete, truncate.

Plain functions of the session, which owns the conversation they edit.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..protocol import client_events as ce
from ..protocol.errors import ErrorCode
from ..protocol.mcp import McpApprovalResponseItem
from ..protocol.responses import StatusReason
from ..protocol.server_events import (
    ConversationItemAdded,
    ConversationItemDeleted,
    ConversationItemDone,
    ConversationItemRetrieved,
    ConversationItemTruncated,
)
from .actions import Action, Send
from .conversation import AssistantItem
from .lifecycle import cancel_response
from .mcp_flow import on_answer
from .playout import client_stopped

if TYPE_CHECKING:
    from .session import Session

__all__ = ["on_item_create", "on_item_delete", "on_item_retrieve", "on_item_truncate"]


def on_item_create(session: Session, event: ce.ConversationItemCreate, now: float) -> list[Action]:
    session._admit_media(event, now)  # first, as `predecode` charges before it decodes
    item = event.item
    if item.id is not None and item.id in session.conversation:
        return session._error(ErrorCode.DUPLICATE_ITEM_ID, event.event_id, param="item.id", item_id=item.id)
    previous = event.previous_item_id
    if previous is not None and previous != "root" and previous not in session.conversation:
        return session._error(
            ErrorCode.ITEM_CREATE_INVALID_PREVIOUS_ITEM_ID, event.event_id, param="previous_item_id",
            item_id=previous,
        )
    stored = session._store_item(item, "item")
    if stored.nbytes > session.media.max_conversation_bytes:
        return session._error(ErrorCode.ITEM_TOO_LARGE, event.event_id, param="item", num_bytes=stored.nbytes,
                              max_bytes=session.media.max_conversation_bytes)
    actions = session._discard_speculation()
    previous_id = session.conversation.insert(stored, previous)
    view = stored.view()
    actions += [
        Send(ConversationItemAdded(item=view, previous_item_id=previous_id)),
        Send(ConversationItemDone(item=view, previous_item_id=previous_id)),
    ] + session._evict(stored.id)
    if isinstance(view, McpApprovalResponseItem):  # approved: the call runs now
        actions += on_answer(session, view)
    return actions


def on_item_retrieve(session: Session, event: ce.ConversationItemRetrieve, now: float) -> list[Action]:
    entry = session.conversation.get(event.item_id)
    if entry is None:
        return session._error(
            ErrorCode.ITEM_RETRIEVE_INVALID_ITEM_ID, event.event_id, param="item_id", item_id=event.item_id
        )
    if isinstance(entry, AssistantItem):
        view = entry.view(with_audio=True)
    else:
        view = entry.view(input_format=session.config.input_format)
    return [Send(ConversationItemRetrieved(item=view))]


def on_item_delete(session: Session, event: ce.ConversationItemDelete, now: float) -> list[Action]:
    if not session.conversation.delete(event.item_id):
        return session._error(
            ErrorCode.ITEM_DELETE_INVALID_ITEM_ID, event.event_id, param="item_id", item_id=event.item_id
        )
    actions = session._discard_speculation() + session._transcriber.forget_item(event.item_id)
    return actions + [Send(ConversationItemDeleted(item_id=event.item_id))]


def on_item_truncate(session: Session, event: ce.ConversationItemTruncate, now: float) -> list[Action]:
    entry = session.conversation.get(event.item_id)
    if entry is None:
        return session._error(
            ErrorCode.ITEM_TRUNCATE_INVALID_ITEM_ID, event.event_id, param="item_id", item_id=event.item_id
        )
    if not isinstance(entry, AssistantItem) or not entry.is_audio or event.content_index != 0:
        return session._error(
            ErrorCode.TRUNCATE_CONTENT_INDEX_INVALID, event.event_id, param="content_index",
            item_id=event.item_id, content_index=event.content_index,
        )
    actions: list[Action] = []
    if session._response is not None and session._response.item is entry:
        # The client stopped playing this item: the rest of its response is unwanted.
        actions += cancel_response(session, StatusReason.CLIENT_CANCELLED, now)
    duration_ms = entry.audio_ms
    if event.audio_end_ms > duration_ms + 1.0:  # 1 ms: clients round the played time up
        return actions + session._error(
            ErrorCode.TRUNCATE_AUDIO_END_MS_INVALID, event.event_id, param="audio_end_ms",
            audio_end_ms=event.audio_end_ms, duration_ms=int(duration_ms), item_id=event.item_id,
        )
    entry.truncate(min(event.audio_end_ms, int(duration_ms)))
    client_stopped(session, entry.id, event.audio_end_ms, now)  # the client stopped playing it there
    actions += session._discard_speculation()
    return actions + [
        Send(ConversationItemTruncated(
            item_id=event.item_id, content_index=event.content_index, audio_end_ms=event.audio_end_ms
        ))
    ]
