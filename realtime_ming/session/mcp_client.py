"""The MCP client of remote MCP tools: list a server's tools and call one over streamable HTTP (the `mcp` package).

Each listing and each call is one short MCP session (initialize, then `tools/list` or `tools/call`, then the
session is closed), bounded by `McpLimits`: `timeout_s` for all of it, connection included, and
`max_response_bytes` for every byte the server sends back. A server-side fetch is an SSRF surface, so every
HTTP request — the first and any redirect the `mcp` transport follows (it follows only same-origin ones) — is
checked against `allowed_hosts` before it leaves, and so is every redirect's target as it arrives: a request
or a redirect to another host fails the operation (`http_error` 403 naming the host). Failures
come back as `McpFailure` carrying the GA `mcp_call.error` shape; nothing here raises anything else but
cancellation.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Collection
from typing import Any

import httpx2
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_types import PaginatedRequestParams

from ..protocol.mcp import McpCallError, McpTool, McpToolInfo
from .mcp_limits import McpFailure, McpLimits

__all__ = ["McpFailure", "McpLimits", "call_tool", "list_tools"]


class _HostRefused(Exception):
    pass


class _TooLarge(Exception):
    pass


class _BoundedStream(httpx2.AsyncByteStream):
    """A response body that counts its bytes against the operation's budget."""

    def __init__(self, inner: httpx2.AsyncByteStream, budget: _Budget) -> None:
        self._inner = inner
        self._budget = budget

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._inner:
            self._budget.spend(len(chunk))
            yield chunk

    async def aclose(self) -> None:
        await self._inner.aclose()


class _Budget:
    def __init__(self, limit: int) -> None:
        self.left = limit
        self.exceeded = False

    def spend(self, n: int) -> None:
        self.left -= n
        if self.left < 0:
            self.exceeded = True
            raise _TooLarge


class _GuardedTransport(httpx2.AsyncBaseTransport):
    """Refuses a request to a host outside the allowed list; bounds the bytes of every response."""

    def __init__(self, allowed_hosts: Collection[str], budget: _Budget) -> None:
        self._inner = httpx2.AsyncHTTPTransport()
        self._allowed = allowed_hosts
        self._budget = budget
        self.refused: str | None = None

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        host = (request.url.host or "").lower()
        if host not in self._allowed:
            self.refused = host or "(none)"
            raise _HostRefused(host)
        response = await self._inner.handle_async_request(request)
        location = response.headers.get("location") if 300 <= response.status_code < 400 else None
        if location is not None:  # a redirect to a host not listed fails here, named, whoever would follow it
            target = (request.url.join(location).host or "").lower()
            if target not in self._allowed:
                await response.aclose()
                self.refused = target or "(none)"
                raise _HostRefused(target)
        assert isinstance(response.stream, httpx2.AsyncByteStream)
        response.stream = _BoundedStream(response.stream, self._budget)
        return response

    async def aclose(self) -> None:
        await self._inner.aclose()


def _failure(exc: BaseException, transport: _GuardedTransport, budget: _Budget, limits: McpLimits) -> McpFailure:
    """The GA error of a failed operation, from the first cause found in `exc` (groups unwrapped)."""
    if transport.refused is not None:
        return McpFailure(McpCallError("http_error", f"the MCP server's host '{transport.refused}' is not in"
                                                     " server.mcp.allowed_hosts", 403))
    if budget.exceeded:
        return McpFailure(McpCallError("http_error", f"the MCP server sent more than {limits.max_response_bytes}"
                                                     " bytes (server.mcp.max_response_bytes)", 413))
    leaf = exc
    while isinstance(leaf, BaseExceptionGroup) and leaf.exceptions:
        leaf = leaf.exceptions[0]
    if isinstance(leaf, McpFailure):
        return leaf
    if isinstance(leaf, MCPError):
        return McpFailure(McpCallError("protocol_error", leaf.error.message, leaf.error.code))
    if isinstance(leaf, httpx2.HTTPStatusError):
        return McpFailure(McpCallError("http_error", f"the MCP server answered HTTP {leaf.response.status_code}",
                                       leaf.response.status_code))
    if isinstance(leaf, httpx2.HTTPError | OSError):
        return McpFailure(McpCallError("http_error", f"the MCP server could not be reached: {leaf}", 502))
    return McpFailure(McpCallError("protocol_error", f"the MCP exchange failed: {type(leaf).__name__}: {leaf}"))


async def _run(tool: McpTool, limits: McpLimits, operation) -> Any:
    """Open an MCP session to `tool.server_url` under `limits` and run `operation(session)`."""
    budget = _Budget(limits.max_response_bytes)
    transport = _GuardedTransport(limits.allowed_hosts, budget)
    client = httpx2.AsyncClient(transport=transport, headers=tool.request_headers(),
                                timeout=httpx2.Timeout(limits.timeout_s), follow_redirects=False)
    try:
        async with asyncio.timeout(limits.timeout_s):
            async with client, streamable_http_client(tool.server_url, http_client=client) as (read, write):
                async with ClientSession(read, write) as session:
                    await session.initialize()
                    return await operation(session)
    except TimeoutError:
        raise McpFailure(McpCallError("http_error", f"the MCP server did not answer within {limits.timeout_s:g} s"
                                                    " (server.mcp.timeout_s)", 504)) from None
    except Exception as exc:  # noqa: BLE001 -- any failure of the remote exchange is the call's, never the session's
        raise _failure(exc, transport, budget, limits) from exc


async def list_tools(tool: McpTool, limits: McpLimits) -> tuple[McpToolInfo, ...]:
    """The server's tools that `tool.allowed_tools` lets through (every page of the listing)."""

    async def operation(session: ClientSession) -> tuple[McpToolInfo, ...]:
        listed: list[McpToolInfo] = []
        cursor = None
        while True:
            result = await session.list_tools(params=PaginatedRequestParams(cursor=cursor) if cursor else None)
            for t in result.tools:
                annotations = None if t.annotations is None else t.annotations.model_dump(
                    mode="json", by_alias=True, exclude_none=True)
                info = McpToolInfo(t.name, dict(t.input_schema), t.description, annotations)
                if tool.allowed_tools is None or tool.allowed_tools.matches(info.name, info.read_only):
                    listed.append(info)
            cursor = result.next_cursor
            if not cursor:
                return tuple(listed)

    return await _run(tool, limits, operation)


def _output_text(result) -> str:
    """A call result as the model reads it: its text parts joined; other content (images, resources) as JSON."""
    parts = []
    for block in result.content:
        text = getattr(block, "text", None)
        parts.append(text if isinstance(text, str) else json.dumps(block.model_dump(mode="json", exclude_none=True)))
    if not parts and result.structured_content is not None:
        parts.append(json.dumps(result.structured_content))
    return "\n".join(parts)


async def call_tool(tool: McpTool, name: str, arguments: str, limits: McpLimits) -> str:
    """Call tool `name` with the model's JSON `arguments`; its output text. A tool that reports an error
    (`isError`) is a `tool_execution_error`."""
    try:
        args = json.loads(arguments) if arguments.strip() else {}
    except ValueError:
        args = None
    if not isinstance(args, dict):
        raise McpFailure(McpCallError("tool_execution_error", "the arguments are not a JSON object"))

    async def operation(session: ClientSession) -> str:
        result = await session.call_tool(name, args)
        text = _output_text(result)
        if result.is_error:
            raise McpFailure(McpCallError("tool_execution_error", text or "the tool failed"))
        return text

    return await _run(tool, limits, operation)
