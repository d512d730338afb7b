"""A session's remote MCP servers: listing their tools, the model's calls of them, approvals (docs/protocol.md §4.2).

Sans-I/O like the session: `McpServers` returns `ListMcpTools` / `CallMcpTool` actions, the runner runs them
(`mcp_client.py`) and hands each outcome back with `on_listed` / `on_called`.

* A session or response naming an MCP server not listed yet: an `mcp_list_tools` item enters the conversation
  (`conversation.item.added`, `mcp_list_tools.in_progress`); once listed, `conversation.item.done` carries the
  tools and `mcp_list_tools.completed` follows, or `mcp_list_tools.failed` and an `error` (`mcp_list_tools_failed`)
  say why. A server's listed tools are offered to the model like function tools (`expand`).
* The model calls one (`ResponseCalls`): without approval an `mcp_call` item runs inside its response, which ends
  (`response.done`) once every call it started has settled; then, in the default conversation, the server
  creates the follow-up response itself so the model answers from the results.
* With approval required: an `mcp_approval_request` item ends the model's turn; the client's
  `mcp_approval_response` (`approve: true`) runs the call as an `mcp_call` item (with its `approval_request_id`)
  outside any response, then creates the follow-up response; `approve: false` calls nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..protocol.error_codes import ErrorCode
from ..protocol.errors import ProtocolError
from ..protocol.events import ServerEvent
from ..protocol.ids import IdPrefix, new_id
from ..protocol.mcp import (
    McpApprovalRequestItem,
    McpApprovalResponseItem,
    McpCallError,
    McpCallItem,
    McpListToolsItem,
    McpTool,
    McpToolInfo,
)
from ..protocol.mcp_events import (
    McpListToolsCompleted,
    McpListToolsFailed,
    McpListToolsInProgress,
    ResponseMcpCallCompleted,
    ResponseMcpCallFailed,
    ResponseMcpCallInProgress,
)
from ..protocol.server_events import ConversationItemAdded, ConversationItemDone, Error
from ..protocol.values import FunctionTool, Tool
from .actions import Action, CallMcpTool, ListMcpTools, Send
from .conversation import Conversation, StoredItem

__all__ = ["McpServers", "McpTarget"]


@dataclass(frozen=True, slots=True)
class McpTarget:
    """The server and listed tool a model's call names."""

    server: McpTool
    info: McpToolInfo

    @property
    def needs_approval(self) -> bool:
        """Whether the call waits for the client's `mcp_approval_response`."""
        return self.server.needs_approval(self.info.name, self.info.read_only)


def _key(tool: McpTool) -> tuple:
    """What makes a listing reusable: the same server, reached the same way, filtered the same way."""
    return (tool.server_label, tool.server_url, tuple(sorted(tool.request_headers().items())), tool.allowed_tools)


class McpServers:
    """The MCP servers of one session: listings by configuration, calls running, approvals waiting."""

    def __init__(self, conversation: Conversation) -> None:
        self._conversation = conversation
        self._listed: dict[tuple, tuple[McpToolInfo, ...]] = {}  # configuration -> its tools
        self._listing: dict[str, tuple] = {}  # mcp_list_tools item id -> configuration being listed
        self._labels: dict[tuple, str] = {}  # configuration -> its listing item id
        self._approvals: dict[str, tuple[McpTool, McpApprovalRequestItem]] = {}  # request item id -> waiting call
        self.running: dict[str, McpCallItem] = {}  # mcp_call item id -> the call (its task runs)
        self._indexes: dict[str, int] = {}  # mcp_call item id -> output index of its events

    # ---- listing -----------------------------------------------------------------------------------------
    def list_new(self, tools: tuple[Tool, ...]) -> list[Action]:
        """List each MCP server of `tools` whose configuration was never listed (nor is being listed)."""
        actions: list[Action] = []
        for tool in tools:
            if not isinstance(tool, McpTool):
                continue
            key = _key(tool)
            if key in self._listed or key in self._labels:
                continue
            item = McpListToolsItem(id=new_id(IdPrefix.ITEM), server_label=tool.server_label)
            self._listing[item.id] = key
            self._labels[key] = item.id
            previous = self._conversation.last_id()
            self._conversation.insert(StoredItem(item))
            actions += [Send(ConversationItemAdded(item=item, previous_item_id=previous)),
                        Send(McpListToolsInProgress(item_id=item.id)), ListMcpTools(item.id, tool)]
        return actions

    def on_listed(self, item_id: str, tools: tuple[McpToolInfo, ...] | McpCallError) -> list[Action]:
        """A listing ended: its tools (offered from now on), or why it failed (listed again when named again)."""
        key = self._listing.pop(item_id, None)
        if key is None:
            return []
        entry = self._conversation.get(item_id)
        if isinstance(tools, McpCallError):
            del self._labels[key]
            error = ProtocolError(ErrorCode.MCP_LIST_TOOLS_FAILED, server_label=key[0], detail=tools.message)
            return [Send(McpListToolsFailed(item_id=item_id)), Send(Error.from_protocol_error(error))]
        self._listed[key] = tools
        item = McpListToolsItem(id=item_id, server_label=key[0], tools=tools)
        if isinstance(entry, StoredItem):
            entry.item = item
        return [Send(ConversationItemDone(item=item)), Send(McpListToolsCompleted(item_id=item_id))]

    def expand(self, tools: tuple[Tool, ...]) -> tuple[Tool, ...]:
        """`tools` as the model sees them: each listed MCP server's tools as functions (a name already taken
        by an earlier tool keeps the earlier one); a server not listed (yet, or failed) offers nothing."""
        out: list[Tool] = []
        names: set[str] = set()
        for tool in tools:
            if isinstance(tool, FunctionTool):
                out.append(tool)
                names.add(tool.name)
        for tool in tools:
            if isinstance(tool, McpTool):
                for info in self._listed.get(_key(tool), ()):
                    if info.name not in names:
                        names.add(info.name)
                        out.append(FunctionTool(info.name, info.description or "", dict(info.input_schema)))
        return tuple(out)

    def target(self, tools: tuple[Tool, ...], name: str) -> McpTarget | None:
        """The MCP tool `name` of a response's `tools`, unless a function tool (or an earlier server) owns it."""
        if any(isinstance(t, FunctionTool) and t.name == name for t in tools):
            return None
        for tool in tools:
            if isinstance(tool, McpTool):
                for info in self._listed.get(_key(tool), ()):
                    if info.name == name:
                        return McpTarget(tool, info)
        return None

    # ---- calls -------------------------------------------------------------------------------------------
    def take(self, started: list[tuple[McpTarget, McpCallItem, int]],
             approvals: list[tuple[McpTarget, McpApprovalRequestItem]]) -> list[Action]:
        """Run the calls a response just `started` (target, item, output index) and note the `approvals` it
        asks for; both lists are emptied (a response's `ResponseCalls` fills them)."""
        actions: list[Action] = []
        for target, item, index in started:
            actions += self.start_call(target.server, item, index)
        for target, request in approvals:
            self.await_approval(target.server, request)
        started.clear()
        approvals.clear()
        return actions

    def start_call(self, server: McpTool, item: McpCallItem, output_index: int) -> list[Action]:
        """Run `item`'s call: `response.mcp_call.in_progress`, then the runner's task."""
        self.running[item.id] = item
        self._indexes[item.id] = output_index
        return [Send(ResponseMcpCallInProgress(item_id=item.id, output_index=output_index)),
                CallMcpTool(item.id, server, item.name, item.arguments)]

    def on_called(self, item_id: str, outcome: str | McpCallError) -> tuple[McpCallItem | None, list[Action]]:
        """A call settled: the item with its `output` or `error` (stored in the conversation), and its
        `response.mcp_call.completed` / `.failed`."""
        item = self.running.pop(item_id, None)
        if item is None:
            return None, []
        index = self._indexes.pop(item_id)
        if isinstance(outcome, McpCallError):
            item = replace(item, error=outcome)
            event: ServerEvent = ResponseMcpCallFailed(item_id=item_id, output_index=index)
        else:
            item = replace(item, output=outcome)
            event = ResponseMcpCallCompleted(item_id=item_id, output_index=index)
        entry = self._conversation.get(item_id)
        if isinstance(entry, StoredItem):
            entry.item = item
        return item, [Send(event)]

    # ---- approvals ---------------------------------------------------------------------------------------
    def await_approval(self, server: McpTool, request: McpApprovalRequestItem) -> None:
        """The model's call of `request` waits for the client's answer."""
        self._approvals[request.id] = (server, request)

    def check_answer(self, answer: McpApprovalResponseItem, param: str) -> None:
        """An `mcp_approval_response` must answer a request that waits; raises ProtocolError otherwise."""
        if answer.approval_request_id not in self._approvals:
            raise ProtocolError(ErrorCode.MCP_APPROVAL_REQUEST_NOT_FOUND, param=f"{param}.approval_request_id",
                                item_id=answer.approval_request_id)

    def on_answer(self, answer: McpApprovalResponseItem) -> list[Action]:
        """The client answered: approved, the call runs as an `mcp_call` item of the conversation (outside any
        response, output index 0); denied, nothing is called."""
        server, request = self._approvals.pop(answer.approval_request_id)
        if not answer.approve:
            return []
        item = McpCallItem(id=new_id(IdPrefix.ITEM), server_label=request.server_label, name=request.name,
                           arguments=request.arguments, approval_request_id=request.id)
        previous = self._conversation.last_id()
        self._conversation.insert(StoredItem(item))
        return [Send(ConversationItemAdded(item=item, previous_item_id=previous))] + self.start_call(server, item, 0)

    def close(self) -> None:
        """The session ends: nothing waits any more (the runner cancels the running tasks)."""
        self.running.clear()
        self._approvals.clear()
        self._listing.clear()
