"""Remote MCP tools (GA `tools: [{"type": "mcp", ...}]`) and their conversation items (`docs/protocol.md` §4.2).

`McpTool` is one server's configuration: `server_url`, `headers` (plus `authorization` as a bearer token),
`allowed_tools` (names, or a `tool_names` / `read_only` filter), `require_approval` (`always` / `never` / a
filter of the same shape under `always` and `never`). OpenAI's connectors and tunnels (`connector_id`,
`tunnel_id`) and `defer_loading` / `allowed_callers` are `unsupported_parameter`. The items are the GA
`mcp_list_tools`, `mcp_call`, `mcp_approval_request` (written by the server) and `mcp_approval_response`
(created by the client with `conversation.item.create`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Final, Literal

from realtime_ming.protocol.dialect import Dialect
from realtime_ming.protocol.error_codes import ErrorCode
from realtime_ming.protocol.errors import ProtocolError
from realtime_ming.protocol.limits import (
    MAX_DESCRIPTION_CHARS,
    MAX_ID_CHARS,
    MAX_METADATA_PAIRS,
    MAX_METADATA_VALUE_CHARS,
    MAX_NAME_CHARS,
    MAX_TEXT_CHARS,
    MAX_TOOLS,
)
from realtime_ming.protocol.wire import (
    JsonValue,
    expect_bool,
    expect_choice,
    expect_list,
    expect_object,
    expect_text,
    invalid_value,
    join,
)

__all__ = [
    "McpApprovalRequestItem",
    "McpApprovalResponseItem",
    "McpCallError",
    "McpCallItem",
    "McpListToolsItem",
    "McpTool",
    "McpToolFilter",
    "McpToolInfo",
    "decode_approval_response",
    "decode_mcp_tool",
]

MAX_URL_CHARS: Final = 2048


@dataclass(frozen=True, slots=True)
class McpToolFilter:
    """Tools picked by name (`tool_names`, `None` = any) and/or by the server's `readOnlyHint` (`read_only`)."""

    tool_names: tuple[str, ...] | None = None
    read_only: bool | None = None

    def matches(self, name: str, read_only: bool) -> bool:
        """Whether a tool of `name` (annotated read-only or not) passes every condition set."""
        if self.tool_names is not None and name not in self.tool_names:
            return False
        return self.read_only is None or self.read_only == read_only

    def to_wire(self) -> JsonValue:
        """`{"tool_names": [...], "read_only": bool}` (unset keys left out)."""
        wire: dict[str, JsonValue] = {}
        if self.tool_names is not None:
            wire["tool_names"] = list(self.tool_names)
        if self.read_only is not None:
            wire["read_only"] = self.read_only
        return wire


@dataclass(frozen=True, slots=True, kw_only=True)
class McpTool:
    """One remote MCP server offered to the model. `require_approval` is `"always"`, `"never"` or per-tool
    filters (`approval_always` / `approval_never`; a tool matching neither needs approval, as OpenAI's default)."""

    server_label: str
    server_url: str
    headers: Mapping[str, str] = field(default_factory=dict)
    authorization: str | None = None
    server_description: str | None = None
    allowed_tools: McpToolFilter | None = None
    require_approval: Literal["always", "never"] | None = None  # None: decided per tool by the filters
    approval_always: McpToolFilter | None = None
    approval_never: McpToolFilter | None = None

    def needs_approval(self, name: str, read_only: bool) -> bool:
        """Whether calling tool `name` waits for the client's `mcp_approval_response`."""
        if self.require_approval is not None:
            return self.require_approval == "always"
        if self.approval_never is not None and self.approval_never.matches(name, read_only):
            return False
        return True

    def request_headers(self) -> dict[str, str]:
        """The HTTP headers of every request to the server (`authorization` as a bearer token)."""
        headers = dict(self.headers)
        if self.authorization is not None:
            headers["Authorization"] = f"Bearer {self.authorization}"
        return headers

    def to_wire(self, _dialect: Dialect) -> JsonValue:
        """The tool as the session echoes it (header values and the token are not echoed back: secrets)."""
        wire: dict[str, JsonValue] = {"type": "mcp", "server_label": self.server_label, "server_url": self.server_url}
        if self.server_description is not None:
            wire["server_description"] = self.server_description
        if self.allowed_tools is not None:
            wire["allowed_tools"] = self.allowed_tools.to_wire()
        if self.require_approval is not None:
            wire["require_approval"] = self.require_approval
        elif self.approval_always is not None or self.approval_never is not None:
            wire["require_approval"] = {k: f.to_wire() for k, f in (
                ("always", self.approval_always), ("never", self.approval_never)) if f is not None}
        return wire


def _filter(value: Any, param: str) -> McpToolFilter:
    obj = expect_object(value, param)
    names = obj.get("tool_names")
    if names is not None:
        names = tuple(expect_text(n, join(join(param, "tool_names"), i), MAX_NAME_CHARS, single_line=True)
                      for i, n in enumerate(expect_list(names, join(param, "tool_names"), MAX_TOOLS)))
    read_only = obj.get("read_only")
    return McpToolFilter(names, None if read_only is None else expect_bool(read_only, join(param, "read_only")))


def _allowed_tools(value: Any, param: str) -> McpToolFilter | None:
    if value is None:
        return None
    if isinstance(value, list):
        return McpToolFilter(tuple(expect_text(n, join(param, i), MAX_NAME_CHARS, single_line=True)
                                   for i, n in enumerate(expect_list(value, param, MAX_TOOLS))))
    return _filter(value, param)


def _headers(value: Any, param: str) -> dict[str, str]:
    if value is None:
        return {}
    obj = expect_object(value, param)
    if len(obj) > MAX_METADATA_PAIRS:
        raise ProtocolError(ErrorCode.OBJECT_ABOVE_MAX_PROPERTIES, param=param, length=len(obj),
                            max_length=MAX_METADATA_PAIRS)
    headers = {}
    for key, item in obj.items():
        name = expect_text(key, join(param, "<name>"), MAX_NAME_CHARS, single_line=True)
        if not name or not all(c.isalnum() or c in "-_" for c in name):
            raise invalid_value(join(param, name[:MAX_NAME_CHARS]), "a header name is letters, digits, '-' and '_'")
        headers[name] = expect_text(item, join(param, name), MAX_METADATA_VALUE_CHARS, single_line=True)
    return headers


def _unsupported(obj: Mapping[str, Any], param: str) -> None:
    for key, detail in (("connector_id", "OpenAI's service connectors are not reachable from this server; give"
                                         " the MCP server's own 'server_url'"),
                        ("tunnel_id", "Secure MCP Tunnels are OpenAI's; give a 'server_url'"),
                        ("defer_loading", "tools are always listed when the session is updated"),
                        ("allowed_callers", "the model is the only caller")):
        if obj.get(key) not in (None, False) and not (key == "allowed_callers" and obj[key] == ["direct"]):
            raise ProtocolError(ErrorCode.UNSUPPORTED_PARAMETER, param=join(param, key), detail=detail)


def decode_mcp_tool(obj: Mapping[str, Any], param: str, dialect: Dialect) -> McpTool:
    """A `{"type": "mcp", ...}` tool of `tools[i]` (GA only); raises ProtocolError naming the field."""
    if dialect is Dialect.BETA:
        raise invalid_value(join(param, "type"), "MCP tools are part of the GA protocol only")
    _unsupported(obj, param)
    label = expect_text(obj.get("server_label"), join(param, "server_label"), MAX_NAME_CHARS, single_line=True)
    if not label:
        raise invalid_value(join(param, "server_label"), "the server label must not be empty")
    if obj.get("server_url") is None:
        raise invalid_value(join(param, "server_url"), "an MCP tool needs the 'server_url' of its server")
    url = expect_text(obj["server_url"], join(param, "server_url"), MAX_URL_CHARS, single_line=True)
    if not url.startswith(("http://", "https://")):
        raise invalid_value(join(param, "server_url"), "an http:// or https:// URL of an MCP streamable-HTTP server")
    approval = obj.get("require_approval")
    always = never = None
    mode: Literal["always", "never"] | None = "always" if approval is None else None
    if isinstance(approval, str):
        mode = expect_choice(approval, join(param, "require_approval"), ("always", "never"))  # type: ignore[assignment]
    elif approval is not None:
        spec = expect_object(approval, join(param, "require_approval"))
        always = None if spec.get("always") is None else _filter(spec["always"], join(param, "require_approval.always"))
        never = None if spec.get("never") is None else _filter(spec["never"], join(param, "require_approval.never"))
    description = obj.get("server_description")
    authorization = obj.get("authorization")
    return McpTool(
        server_label=label, server_url=url, headers=_headers(obj.get("headers"), join(param, "headers")),
        authorization=None if authorization is None else expect_text(
            authorization, join(param, "authorization"), MAX_TEXT_CHARS, single_line=True),
        server_description=None if description is None else expect_text(
            description, join(param, "server_description"), MAX_DESCRIPTION_CHARS),
        allowed_tools=_allowed_tools(obj.get("allowed_tools"), join(param, "allowed_tools")),
        require_approval=mode, approval_always=always, approval_never=never)


@dataclass(frozen=True, slots=True)
class McpToolInfo:
    """One tool a server listed: its JSON schema and annotations are kept verbatim."""

    name: str
    input_schema: Mapping[str, JsonValue]
    description: str | None = None
    annotations: Mapping[str, JsonValue] | None = None

    @property
    def read_only(self) -> bool:
        """The server's `readOnlyHint`."""
        return bool((self.annotations or {}).get("readOnlyHint"))

    def to_wire(self, _dialect: Dialect | None = None) -> JsonValue:
        """`{name, input_schema, description, annotations}`."""
        return {"name": self.name, "input_schema": dict(self.input_schema), "description": self.description,
                "annotations": None if self.annotations is None else dict(self.annotations)}


@dataclass(frozen=True, slots=True, kw_only=True)
class McpListToolsItem:
    """The tools one MCP server offers (empty while listing, or when the listing failed)."""

    type: ClassVar[str] = "mcp_list_tools"
    id: str
    server_label: str
    tools: tuple[McpToolInfo, ...] = ()

    def to_wire(self, dialect: Dialect) -> JsonValue:
        """Wire item."""
        return {"type": self.type, "id": self.id, "server_label": self.server_label,
                "tools": [tool.to_wire(dialect) for tool in self.tools]}


@dataclass(frozen=True, slots=True)
class McpCallError:
    """Why a call failed: `protocol_error` (JSON-RPC code), `tool_execution_error` or `http_error` (status)."""

    type: Literal["protocol_error", "tool_execution_error", "http_error"]
    message: str
    code: int | None = None

    def to_wire(self, _dialect: Dialect | None = None) -> JsonValue:
        """Wire error object."""
        wire: dict[str, JsonValue] = {"type": self.type, "message": self.message}
        if self.type != "tool_execution_error":
            wire["code"] = self.code or 0
        return wire


@dataclass(frozen=True, slots=True, kw_only=True)
class McpCallItem:
    """A call of an MCP tool: `output` once it succeeded, `error` once it failed, neither while it runs."""

    type: ClassVar[str] = "mcp_call"
    id: str
    server_label: str
    name: str
    arguments: str
    approval_request_id: str | None = None
    output: str | None = None
    error: McpCallError | None = None

    def to_wire(self, dialect: Dialect) -> JsonValue:
        """Wire item."""
        return {"type": self.type, "id": self.id, "server_label": self.server_label, "name": self.name,
                "arguments": self.arguments, "approval_request_id": self.approval_request_id,
                "output": self.output, "error": None if self.error is None else self.error.to_wire(dialect)}


@dataclass(frozen=True, slots=True, kw_only=True)
class McpApprovalRequestItem:
    """The model wants to call a tool that needs the client's approval first."""

    type: ClassVar[str] = "mcp_approval_request"
    id: str
    server_label: str
    name: str
    arguments: str

    def to_wire(self, _dialect: Dialect) -> JsonValue:
        """Wire item."""
        return {"type": self.type, "id": self.id, "server_label": self.server_label, "name": self.name,
                "arguments": self.arguments}


@dataclass(frozen=True, slots=True, kw_only=True)
class McpApprovalResponseItem:
    """The client's answer to an `mcp_approval_request`."""

    type: ClassVar[str] = "mcp_approval_response"
    approval_request_id: str
    approve: bool
    reason: str | None = None
    id: str | None = None

    def to_wire(self, _dialect: Dialect) -> JsonValue:
        """Wire item."""
        wire: dict[str, JsonValue] = {"type": self.type, "approval_request_id": self.approval_request_id,
                                      "approve": self.approve}
        if self.id is not None:
            wire["id"] = self.id
        if self.reason is not None:
            wire["reason"] = self.reason
        return wire


def decode_approval_response(obj: Mapping[str, Any], param: str, item_id: str | None) -> McpApprovalResponseItem:
    """A client `mcp_approval_response` item; raises ProtocolError naming the field."""
    request_id = expect_text(obj.get("approval_request_id"), join(param, "approval_request_id"), MAX_ID_CHARS,
                             single_line=True)
    reason = obj.get("reason")
    return McpApprovalResponseItem(
        approval_request_id=request_id, approve=expect_bool(obj.get("approve"), join(param, "approve")),
        reason=None if reason is None else expect_text(reason, join(param, "reason"), MAX_DESCRIPTION_CHARS), id=item_id)
