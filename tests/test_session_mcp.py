"""Remote MCP tools are an SSRF surface: only hosts in `server.mcp.allowed_hosts` may be named, and a refused
update or response changes nothing."""

from __future__ import annotations

import time

import pytest
from session_support import Harness, last_error, user_message

from realtime_ming.engine.api import FinishReason, ToolCallArguments, ToolCallEnd, ToolCallStart, TurnDone
from realtime_ming.protocol.mcp import McpCallError, McpToolInfo
from realtime_ming.server import load_config
from realtime_ming.server.config import ConfigError
from realtime_ming.session.actions import CallMcpTool, ListMcpTools

FUNCTION = {"type": "function", "name": "get_time", "parameters": {"type": "object", "properties": {}}}


def _mcp(url: str = "http://127.0.0.1:9/mcp", label: str = "weather", approval: str = "never") -> dict:
    return {"type": "mcp", "server_label": label, "server_url": url, "require_approval": approval}


def _harness(allowed: tuple[str, ...] = ()) -> Harness:
    return Harness(mcp_allowed_hosts=allowed)  # a session of a server whose operator listed these hosts


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


WEATHER = McpToolInfo("get_weather", {"type": "object", "properties": {"city": {"type": "string"}}}, "Weather.")


def _listed(approval: str) -> Harness:
    """A session whose MCP server (approval as given) is listed with `get_weather`, text output."""
    h = _harness(("127.0.0.1",))
    h.send(type="session.update", session={"type": "realtime", "output_modalities": ["text"],
                                           "tools": [_mcp(approval=approval)]})
    h._take(h.session.on_mcp_listed(h.frames[-1]["item_id"], (WEATHER,), time.monotonic()))
    return h


def _calls_weather(h: Harness, turn_id: str) -> None:
    """The engine turn `turn_id` calls get_weather for Paris and ends."""
    h.engine(ToolCallStart(turn_id, "get_weather"))
    h.engine(ToolCallArguments(turn_id, '{"city": "Paris"}'))
    h.engine(ToolCallEnd(turn_id, "get_weather", '{"city": "Paris"}'))
    h.engine(TurnDone(turn_id, "", FinishReason.STOP, 12, 0, 3, 0, {}))


def _approved_call(h: Harness) -> str:
    """The model asks to call get_weather, the client approves: the CallMcpTool's item id."""
    h.send(type="conversation.item.create", item=user_message({"type": "input_text", "text": "Weather?"}))
    h.send(type="response.create", response={"tool_choice": "required"})
    _calls_weather(h, h.submitted()[-1].turn_id)
    request = next(o for o in h.last("response.done")["response"]["output"] if o["type"] == "mcp_approval_request")
    h.send(type="conversation.item.create", item={
        "type": "mcp_approval_response", "approval_request_id": request["id"], "approve": True})
    return [c for c in h.commands if isinstance(c, CallMcpTool)][-1].item_id


@pytest.mark.parametrize("ending", ["completed", "cancelled"])
def test_an_approved_call_settling_during_a_response_is_answered_once_it_completes(ending):
    """An approved call settles while another response runs: no response is started beside it; once that
    response completes, the follow-up response starts and its prompt holds the call's output. A response
    cancelled meanwhile (the user speaks) leaves the answer to the next response: none is started."""
    h = _listed("always")
    call_id = _approved_call(h)
    h.send(type="response.create", response={"instructions": "Be brief."})
    running = h.submitted()[-1].turn_id
    since = len(h.frames)
    h._take(h.session.on_mcp_called(call_id, "sunny in Paris", time.monotonic()))
    assert h.types(since) == ["response.mcp_call.completed", "conversation.item.done"]
    assert h.frames[-1]["item"]["output"] == "sunny in Paris" and h.session.active_response_id == running
    if ending == "cancelled":
        h.send(type="response.cancel")
        assert h.last("response.done")["response"]["status"] == "cancelled"
        assert h.session.active_response_id is None and h.submitted()[-1].turn_id == running
        return
    since = len(h.frames)
    h.finish_turn(running, "Let me check.")
    types = h.types(since)
    assert types[types.index("response.done") + 1] == "response.created"
    follow_up = h.submitted()[-1]
    assert follow_up.turn_id == h.session.active_response_id != running
    assert follow_up.system == "Be brief." and not follow_up.forced_choices
    assert any(m.role == "tool" and "sunny in Paris" in (m.content[0].text or "") for m in follow_up.history)


def test_an_approved_call_with_no_response_running_is_answered_at_once():
    """No response running when the approved call settles: the follow-up starts right after its item is done."""
    h = _listed("always")
    call_id = _approved_call(h)
    since = len(h.frames)
    h._take(h.session.on_mcp_called(call_id, "sunny in Paris", time.monotonic()))
    assert h.types(since)[:3] == ["response.mcp_call.completed", "conversation.item.done", "response.created"]
