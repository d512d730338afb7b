"""Remote MCP tools in a session: which servers it may call (the operator's `server.mcp.allowed_hosts`).

The server itself would call an MCP tool's `server_url`, so a `session.update` / `response.create` whose
tools name a host that is not listed is refused whole (nothing of it applied): `mcp_tools_disabled` when
the list is empty (the default), `mcp_server_not_allowed` naming the host otherwise. Listing and calling
remote tools: `mcp_calls.py` (state), `mcp_flow.py` (a call's outcome settling its response), `lifecycle.py` (a
response waiting for its calls, follow-ups), `mcp_client.py` (the I/O, run by the runner).
"""

from __future__ import annotations

from collections.abc import Collection
from urllib.parse import urlsplit

from ..protocol.error_codes import ErrorCode
from ..protocol.errors import ProtocolError
from ..protocol.mcp import McpTool
from ..protocol.values import FunctionTool, Tool

__all__ = ["check_mcp_tools", "function_tools", "server_host"]


def server_host(url: str) -> str:
    """The host of a `server_url` (lower case; IPv6 without brackets); '' when it has none."""
    try:
        return (urlsplit(url).hostname or "").lower()
    except ValueError:
        return ""


def function_tools(tools: tuple[Tool, ...]) -> tuple[FunctionTool, ...]:
    """The function tools among `tools` (the ones the model sees as functions)."""
    return tuple(t for t in tools if isinstance(t, FunctionTool))


def check_mcp_tools(tools: tuple[Tool, ...], allowed_hosts: Collection[str], param: str) -> None:
    """Raise ProtocolError for the first MCP tool of `tools` (at `param`, e.g. `session.tools`) this server
    may not or does not serve."""
    for index, tool in enumerate(tools):
        if not isinstance(tool, McpTool):
            continue
        where = f"{param}[{index}].server_url"
        if not allowed_hosts:
            raise ProtocolError(ErrorCode.MCP_TOOLS_DISABLED, param=where)
        host = server_host(tool.server_url)
        if host not in allowed_hosts:
            raise ProtocolError(ErrorCode.MCP_SERVER_NOT_ALLOWED, param=where, host=host or "(none)",
                                allowed=", ".join(sorted(allowed_hosts)))
