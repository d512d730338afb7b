"""Server events of remote MCP tools (GA, `docs/protocol.md` §4.2): listing a server's tools and calling one.

Sent only to a session that configured an MCP tool (`dialect.GA_OPT_IN_SERVER_TYPES`): clients that never
ask for MCP (pipecat's fixed event list) never see them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from realtime_ming.protocol.events import ServerEvent, register

__all__ = [
    "MCP_SERVER_TYPES",
    "McpListToolsCompleted",
    "McpListToolsFailed",
    "McpListToolsInProgress",
    "ResponseMcpCallArgumentsDelta",
    "ResponseMcpCallArgumentsDone",
    "ResponseMcpCallCompleted",
    "ResponseMcpCallFailed",
    "ResponseMcpCallInProgress",
]


@register
@dataclass(frozen=True, slots=True, kw_only=True)
class McpListToolsInProgress(ServerEvent):
    """The server is listing the tools of the MCP server of `mcp_list_tools` item `item_id`."""

    type: ClassVar[str] = "mcp_list_tools.in_progress"
    item_id: str


@register
@dataclass(frozen=True, slots=True, kw_only=True)
class McpListToolsCompleted(ServerEvent):
    """The listing succeeded; `conversation.item.done` carries the tools."""

    type: ClassVar[str] = "mcp_list_tools.completed"
    item_id: str


@register
@dataclass(frozen=True, slots=True, kw_only=True)
class McpListToolsFailed(ServerEvent):
    """The listing failed (an `error` event says why); the server's tools are not offered."""

    type: ClassVar[str] = "mcp_list_tools.failed"
    item_id: str


@register
@dataclass(frozen=True, slots=True, kw_only=True)
class ResponseMcpCallArgumentsDelta(ServerEvent):
    """Chunk of an MCP call's JSON arguments as the model writes them."""

    type: ClassVar[str] = "response.mcp_call_arguments.delta"
    response_id: str
    item_id: str
    output_index: int
    delta: str


@register
@dataclass(frozen=True, slots=True, kw_only=True)
class ResponseMcpCallArgumentsDone(ServerEvent):
    """The MCP call's arguments are complete."""

    type: ClassVar[str] = "response.mcp_call_arguments.done"
    response_id: str
    item_id: str
    output_index: int
    arguments: str


@register
@dataclass(frozen=True, slots=True, kw_only=True)
class ResponseMcpCallInProgress(ServerEvent):
    """The server is calling the tool."""

    type: ClassVar[str] = "response.mcp_call.in_progress"
    item_id: str
    output_index: int


@register
@dataclass(frozen=True, slots=True, kw_only=True)
class ResponseMcpCallCompleted(ServerEvent):
    """The tool answered; the `mcp_call` item's `output` holds it."""

    type: ClassVar[str] = "response.mcp_call.completed"
    item_id: str
    output_index: int


@register
@dataclass(frozen=True, slots=True, kw_only=True)
class ResponseMcpCallFailed(ServerEvent):
    """The call failed; the `mcp_call` item's `error` says why."""

    type: ClassVar[str] = "response.mcp_call.failed"
    item_id: str
    output_index: int


MCP_SERVER_TYPES = frozenset(cls.type for cls in (
    McpListToolsInProgress, McpListToolsCompleted, McpListToolsFailed, ResponseMcpCallArgumentsDelta,
    ResponseMcpCallArgumentsDone, ResponseMcpCallInProgress, ResponseMcpCallCompleted, ResponseMcpCallFailed))
