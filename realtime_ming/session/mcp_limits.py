"""The bounds and the failure of a remote MCP operation, apart from the client (`mcp_client`).

The client imports the `mcp` package and its HTTP stack; this module does not, so the session runner and the
transports name these types without loading that stack until a session actually uses an MCP tool.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..protocol.mcp import McpCallError

__all__ = ["McpFailure", "McpLimits"]


@dataclass(frozen=True, slots=True)
class McpLimits:
    """The operator's bounds (`server.mcp`): the hosts that may be fetched, time and bytes per operation."""

    allowed_hosts: frozenset[str]
    timeout_s: float = 10.0
    max_response_bytes: int = 2**20


class McpFailure(Exception):
    """A listing or call failed; `error` is what the `mcp_call` item (or the listing's `error` event) shows."""

    def __init__(self, error: McpCallError) -> None:
        super().__init__(error.message)
        self.error = error
