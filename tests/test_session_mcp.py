"""Remote MCP tools are an SSRF surface: only hosts in `server.mcp.allowed_hosts` may be named, and a refused
update or response changes nothing."""

from __future__ import annotations

import pytest
from session_support import Harness, last_error

from realtime_ming.protocol.mcp import McpCallError, McpToolInfo
from realtime_ming.server import load_config
from realtime_ming.server.config import ConfigError
from realtime_ming.session.actions import ListMcpTools

FUNCTION = {"type": "function", "name": "get_time", "parameters": {"type": "object", "properties": {}}}


def _mcp(url: str = "http://127.0.0.1:9/mcp", label: str = "weather") -> dict:
    return {"type": "mcp", "server_label": label, "server_url": url, "require_approval": "never"}


def _harness(allowed: tuple[str, ...] = ()) -> Harness:
    h = Harness()
    if allowed:  # a session of a server whose operator listed these hosts
        h.session.mcp_allowed_hosts = frozenset(allowed)
    return h


def test_mcp_tools_are_refused_when_no_host_is_allowed():
    """The default (no allowed host): mcp_tools_disabled naming the tool's server_url; the function tool and
    the instructions of the same update are not applied."""
    h = _harness()
    before = h.session.config
    h.send(type="session.update", event_id="u1", session={
        "type": "realtime", "instructions": "new", "tools": [FUNCTION, _mcp()]})
    error = last_error(h)
    assert (error["code"], error["param"], error["event_id"]) == (
        "mcp_tools_disabled", "session.tools[1].server_url", "u1")
    assert "server.mcp.allowed_hosts" in error["message"]
    assert h.session.config == before


@pytest.mark.parametrize("url", ["http://169.254.169.254/latest/meta-data", "http://localhost:8080/mcp",
                                 "https://127.0.0.1.nip.io/mcp"])
def test_a_host_outside_the_list_is_refused_by_name(url):
    """An allowed list of 127.0.0.1: any other host (metadata IP, another name for loopback) is refused with
    mcp_server_not_allowed naming it, in session.update and in response.create alike."""
    h = _harness(("127.0.0.1",))
    h.send(type="session.update", event_id="u2", session={"type": "realtime", "tools": [_mcp(url)]})
    error = last_error(h)
    assert (error["code"], error["param"]) == ("mcp_server_not_allowed", "session.tools[0].server_url")
    assert f"'{url.split('/')[2].split(':')[0]}'" in error["message"] and "127.0.0.1" in error["message"]
    h.send(type="response.create", event_id="r1", response={"tools": [_mcp(url)]})
    error = last_error(h)
    assert (error["code"], error["param"], error["event_id"]) == (
        "mcp_server_not_allowed", "response.tools[0].server_url", "r1")
    assert not h.submitted()


def test_allowed_hosts_reach_the_session_from_the_server_config():
    """server.mcp.allowed_hosts is read from the config (lower-case hosts only) and bounded in time and bytes."""
    cfg = load_config(None, ["server.mcp.allowed_hosts=[127.0.0.1, tools.example]", "server.mcp.timeout_s=5"])
    assert cfg.server.mcp.allowed_hosts == ("127.0.0.1", "tools.example") and cfg.server.mcp.timeout_s == 5
    with pytest.raises(ConfigError):
        load_config(None, ["server.mcp.allowed_hosts=[http://x/]"])


def test_an_allowed_host_is_listed_and_its_tools_offered():
    """An allowed host's tool is accepted; its server is listed (an mcp_list_tools item, in_progress, then the
    tools and completed); the listed tools are rendered into the next turn's prompt like function tools; a
    failed listing is mcp_list_tools.failed plus an error naming the server."""
    h = _harness(("127.0.0.1",))
    h.send(type="session.update", session={"type": "realtime", "tools": [_mcp()]})
    types = [f["type"] for f in h.frames]
    assert types[-3:] == ["session.updated", "conversation.item.added", "mcp_list_tools.in_progress"]
    listing = [c for c in h.commands if isinstance(c, ListMcpTools)]
    assert len(listing) == 1 and listing[0].server.server_url == "http://127.0.0.1:9/mcp"
    item_id = h.frames[-1]["item_id"]
    info = McpToolInfo("get_weather", {"type": "object", "properties": {"city": {"type": "string"}}}, "Weather.")
    h._take(h.session.on_mcp_listed(item_id, (info,), 0.0))
    assert [f["type"] for f in h.frames[-2:]] == ["conversation.item.done", "mcp_list_tools.completed"]
    assert h.frames[-2]["item"]["tools"][0]["name"] == "get_weather"
    h.send(type="response.create")
    request = h.submitted()[-1]
    assert [t["function"]["name"] for t in request.tools] == ["get_weather"]
    # the same server named again is not listed again; another one that fails says why
    h.send(type="session.update", session={"type": "realtime", "tools": [_mcp(), _mcp("http://127.0.0.1:8/x", "maps")]})
    listing = [c for c in h.commands if isinstance(c, ListMcpTools)]
    assert len(listing) == 2
    failed_id = h.frames[-1]["item_id"]
    h._take(h.session.on_mcp_listed(failed_id, McpCallError("http_error", "refused", 502), 0.0))
    assert h.frames[-2] == {"type": "mcp_list_tools.failed", "item_id": failed_id, "event_id": h.frames[-2]["event_id"]}
    error = last_error(h)
    assert error["code"] == "mcp_list_tools_failed" and "'maps'" in error["message"] and "refused" in error["message"]


def test_an_approval_response_with_no_request_is_refused():
    """An mcp_approval_response names a request that does not exist: a clear error, the conversation unchanged."""
    h = _harness()
    h.send(type="conversation.item.create", event_id="a1", item={
        "type": "mcp_approval_response", "approval_request_id": "item_x", "approve": True})
    error = last_error(h)
    assert (error["code"], error["param"], error["event_id"]) == (
        "mcp_approval_request_not_found", "item.approval_request_id", "a1")
    assert "conversation.item.added" not in h.types()
