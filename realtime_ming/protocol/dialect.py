"""GA / beta dialects and the one alias table between them (`docs/protocol.md` §7).

Event classes, content types and session fields use GA names; `codec.parse` / `codec.serialise`
translate through the tables below for beta connections. Nothing outside `protocol/` branches on
the dialect.
"""

from __future__ import annotations

from enum import StrEnum
from types import MappingProxyType
from typing import Final

__all__ = [
    "GA_CLIENT_SAFE_SERVER_TYPES",
    "GA_OPT_IN_SERVER_TYPES",
    "PLAYOUT_SERVER_TYPES",
    "TIMINGS_EVENT_TYPE",
    "Dialect",
    "content_type_from_wire",
    "content_type_to_wire",
    "server_type_to_wire",
]


class Dialect(StrEnum):
    """Shape of one connection: GA (default) or beta (`OpenAI-Beta: realtime=v1`)."""

    GA = "ga"
    BETA = "beta"


# GA server event name -> beta name; `None` means the beta shape has no such event and it is
# dropped. Beta announces a new item once (`conversation.item.created`, sent where GA sends
# `conversation.item.added`); the GA `conversation.item.done` has no beta counterpart.
_BETA_SERVER_TYPES: Final = MappingProxyType(
    {
        "conversation.item.added": "conversation.item.created",
        "conversation.item.done": None,
        "input_audio_buffer.timeout_triggered": None,  # idle_timeout_ms is GA only
        "response.output_text.delta": "response.text.delta",
        "response.output_text.done": "response.text.done",
        "response.output_audio.delta": "response.audio.delta",
        "response.output_audio.done": "response.audio.done",
        "response.output_audio_transcript.delta": "response.audio_transcript.delta",
        "response.output_audio_transcript.done": "response.audio_transcript.done",
        # remote MCP tools are GA only
        **dict.fromkeys(("mcp_list_tools.in_progress", "mcp_list_tools.completed", "mcp_list_tools.failed",
                         "response.mcp_call_arguments.delta", "response.mcp_call_arguments.done",
                         "response.mcp_call.in_progress", "response.mcp_call.completed", "response.mcp_call.failed")),
    }
)

# GA content part type -> beta name (assistant message content).
_BETA_CONTENT_TYPES: Final = MappingProxyType({"output_text": "text", "output_audio": "audio"})
_GA_CONTENT_TYPES: Final = MappingProxyType({beta: ga for ga, beta in _BETA_CONTENT_TYPES.items()})

TIMINGS_EVENT_TYPE: Final = "realtime_ming.response.timings"

# The 31 server event types pipecat 1.14.0 accepts (`docs/protocol.md` §9): a GA
# connection receives nothing else, except `TIMINGS_EVENT_TYPE` after an explicit opt-in.
GA_CLIENT_SAFE_SERVER_TYPES: Final = frozenset(
    {
        "error",
        "session.created",
        "session.updated",
        "conversation.created",
        "input_audio_buffer.committed",
        "input_audio_buffer.cleared",
        "input_audio_buffer.speech_started",
        "input_audio_buffer.speech_stopped",
        "conversation.item.added",
        "conversation.item.done",
        "conversation.item.input_audio_transcription.delta",
        "conversation.item.input_audio_transcription.completed",
        "conversation.item.input_audio_transcription.failed",
        "conversation.item.truncated",
        "conversation.item.deleted",
        "conversation.item.retrieved",
        "response.created",
        "response.done",
        "response.output_item.added",
        "response.output_item.done",
        "response.content_part.added",
        "response.content_part.done",
        "response.output_text.delta",
        "response.output_text.done",
        "response.output_audio_transcript.delta",
        "response.output_audio_transcript.done",
        "response.output_audio.delta",
        "response.output_audio.done",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "rate_limits.updated",
    }
)


# GA events outside pipecat's list, sent only to a session that asked for the feature they belong to
# (pipecat 1.14 ignores unknown types; it never sets idle_timeout_ms).
# The MCP events go only to a session with an MCP tool.
GA_OPT_IN_SERVER_TYPES: Final = frozenset({
    "input_audio_buffer.timeout_triggered",
    "mcp_list_tools.in_progress", "mcp_list_tools.completed", "mcp_list_tools.failed",
    "response.mcp_call_arguments.delta", "response.mcp_call_arguments.done",
    "response.mcp_call.in_progress", "response.mcp_call.completed", "response.mcp_call.failed",
})

# GA events of a transport whose server owns the playout buffer (WebRTC: the audio goes out on a media track
# paced by its clock). A WebSocket client plays the audio itself and never gets them.
PLAYOUT_SERVER_TYPES: Final = frozenset(
    {"output_audio_buffer.started", "output_audio_buffer.stopped", "output_audio_buffer.cleared"})


def server_type_to_wire(ga_type: str, dialect: Dialect) -> str | None:
    """Wire name of a server event in `dialect`; `None` when that dialect drops the event."""
    if dialect is Dialect.GA:
        return ga_type
    return _BETA_SERVER_TYPES.get(ga_type, ga_type)


def content_type_to_wire(ga_type: str, dialect: Dialect) -> str:
    """Wire name of a content part type (`output_audio` is `audio` in beta)."""
    if dialect is Dialect.GA:
        return ga_type
    return _BETA_CONTENT_TYPES.get(ga_type, ga_type)


def content_type_from_wire(wire_type: str) -> str:
    """GA name of a received content part type.

    Both spellings are accepted on every connection: clients replaying history mix them up, and
    the meaning is unambiguous.
    """
    return _GA_CONTENT_TYPES.get(wire_type, wire_type)
