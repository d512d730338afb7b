"""Remote MCP tools are an SSRF surface: only hosts in `server.mcp.allowed_hosts` may be named, and a refused
update or response changes nothing."""

from __future__ import annotations

import pytest
from session_support import Harness, last_error

from realtime_ming.server import load_config
from realtime_ming.server.config import ConfigError

FUNCTION = {"type": "function", "name": "get_time", "parameters": {"type": "object", "properties": {}}}


def _mcp(url: str = "http://127.0.0.1:9/mcp") -> dict:
    return {"type": "mcp", "server_label": "weather", "server_url": url, "require_approval": "never"}


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


def test_an_allowed_host_is_refused_until_remote_calls_are_served():
    """Listing and calling remote tools are not served yet: an allowed host's tool is unsupported_parameter,
    never accepted and then left uncalled."""
    h = _harness(("127.0.0.1",))
    h.send(type="session.update", session={"type": "realtime", "tools": [_mcp()]})
    error = last_error(h)
    assert (error["code"], error["param"]) == ("unsupported_parameter", "session.tools[0]")
    assert h.session.config.tools == ()


def test_an_approval_response_with_no_request_is_refused():
    """An mcp_approval_response names a request that does not exist: a clear error, the conversation unchanged."""
    h = _harness()
    h.send(type="conversation.item.create", event_id="a1", item={
        "type": "mcp_approval_response", "approval_request_id": "item_x", "approve": True})
    error = last_error(h)
    assert (error["code"], error["param"], error["event_id"]) == (
        "mcp_approval_request_not_found", "item.approval_request_id", "a1")
    assert "conversation.item.added" not in h.types()
