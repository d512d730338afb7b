"""No frame can kill a session: the protocol fuzzer run briefly, and a lone surrogate in every text
field of every client event type.

The server runs on loopback with a scripted engine that, like the real tokenizer, cannot take a
lone surrogate (`_TokenizingEngine`); the real tiny model takes the killer frames of the attack
report in `test_server_realtime.py::test_killer_frames_leave_the_real_engine_serving`, and the
full-size run (`python -m bench.fuzz`) fuzzes it. Every server frame is validated against the
`openai` package's event types of its dialect.
"""

from __future__ import annotations

import asyncio
import copy
import json
import logging
from collections import Counter

import pytest
from server_support import StubEngine, WsClient, seconds, validate_frame
from websockets.asyncio.client import connect

from bench.fuzz import capture_logs, run_fuzz
from bench.fuzz_frames import CLASSES, leaves, set_leaf, templates
from realtime_ming.protocol import Dialect
from realtime_ming.server import RealtimeServer, load_config
from realtime_ming.session.items import ItemEvents

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

SURROGATES = ("x\ud800", "\udc00", "a\udbffb", "\udfff\ud800")


class _TokenizingEngine(StubEngine):
    """The scripted engine, plus what the tokenizer does first: encode every text of a request.

    A text that cannot be encoded would raise inside the real engine; here it is recorded in
    `unencodable` (the test then fails) and the turn still runs.
    """

    def __init__(self) -> None:
        super().__init__(words=("Fine", " thanks."), chunk_s=0.02, step_s=0.005)
        self.unencodable: list[str] = []

    def submit(self, request, sink) -> None:
        texts = [request.system or ""] + [c.text or "" for m in request.history for c in m.content]
        for text in texts:
            try:
                text.encode("utf-8")
            except UnicodeEncodeError:
                self.unencodable.append(text)
        super().submit(request, sink)


def _config(max_frame_bytes: int = 262_144):
    return load_config(None, [
        "server.port=0", f"server.limits.max_frame_bytes={max_frame_bytes}",
        f"server.limits.max_message_bytes={4 * max_frame_bytes}",
    ])


@pytest.fixture
async def stub_server():
    engine = _TokenizingEngine()
    async with RealtimeServer(_config(), engine) as server:
        yield server, engine
    engine.close()


async def _open(port: int, dialect: Dialect) -> WsClient:
    headers = {"OpenAI-Beta": "realtime=v1"} if dialect is Dialect.BETA else {}
    ws = await connect(f"ws://127.0.0.1:{port}/v1/realtime?model=ming", additional_headers=headers, max_size=None)
    client = WsClient(ws, dialect)
    assert (await client.recv())["type"] == "session.created"
    return client


async def _normal_turn(client: WsClient) -> str:
    """A user text item and a text response; returns the response's status."""
    modalities = "output_modalities" if client.dialect is Dialect.GA else "modalities"
    await client.send(type="conversation.item.create", item={
        "type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hello there"}]})
    await client.send(type="response.create", response={modalities: ["text"]})
    return (await client.recv_until("response.done", timeout=20))[-1]["response"]["status"]


async def test_fuzz_brief_run_loses_nothing(stub_server):
    """1,000 seeded frames of every class over 3 sessions (1 beta) and a canary: no session lost,
    no traceback, one specific error per invalid frame, every server frame valid."""
    server, engine = stub_server
    counts: Counter = Counter()
    with capture_logs(counts):
        report = await run_fuzz(
            f"ws://127.0.0.1:{server.port}/v1/realtime?model=ming", frames=1000, sessions=3, beta_sessions=1,
            seed=7, max_frame_bytes=262_144, validate=validate_frame,
        )
    report.log = counts
    assert report.frames == 1000
    assert set(report.frames_by_kind) == {name for name, _ in CLASSES}
    assert report.violations == [] and report.num_violations == 0
    assert report.sessions_lost == 0 and report.invalid_server_frames == 0
    assert counts["traceback"] == 0 and counts["failure"] == 0 and counts["ERROR"] == 0
    assert "server_error" not in report.errors_by_code
    assert report.errors_by_code["invalid_text"] > 0 and report.errors_by_code["nesting_too_deep"] > 0
    assert report.errors_by_code["invalid_number"] > 0 and report.errors_by_code["frame_too_large"] > 0
    assert set(report.final_turns) == {"completed"} and sum(report.final_turns.values()) == 3
    assert report.canary_turns["completed"] >= 1 and set(report.canary_turns) == {"completed"}
    assert engine.unencodable == []
    # One line at most per rejected frame: only the sessions' open/close lines were logged.
    assert counts["INFO"] + counts["WARNING"] <= 4 * (3 + 1 + report.sessions_lost)


def _event_types(dialect: Dialect) -> list[str]:
    return sorted({frame["type"] for frame in templates(dialect, "DB30")})


def _string_fields(dialect: Dialect, event_type: str) -> list[tuple[dict, str]]:
    """(template, path) of every string of every template of `event_type`, the event's `type` too."""
    fields = []
    for frame in templates(dialect, "DB30"):
        if frame["type"] == event_type:
            fields += [(frame, path) for path, value in leaves(frame) if isinstance(value, str)]
    return fields


@pytest.mark.parametrize(
    ("dialect", "event_type"),
    [(d, t) for d in (Dialect.GA, Dialect.BETA) for t in _event_types(d)],
)
async def test_lone_surrogate_in_every_text_field(stub_server, dialect, event_type):
    """Each string of the event (ids, names, text, instructions, tool descriptions, metadata,
    voices, formats, free-form echoes, the type itself): a lone surrogate → exactly one
    `invalid_text` naming the field, echoing the event_id; a concurrent session's turn completes,
    the engine never sees the text, and the session's next normal turn completes."""
    server, engine = stub_server
    client, other = await _open(server.port, dialect), await _open(server.port, Dialect.GA)
    other_turn = asyncio.create_task(_normal_turn(other))
    fields = _string_fields(dialect, event_type)
    assert fields
    for i, (template, path) in enumerate(fields):
        frame = copy.deepcopy(template)
        set_leaf(frame, path, SURROGATES[i % len(SURROGATES)])
        frame["event_id"] = f"evt_{i}"
        await client.ws.send(json.dumps(frame))
        error = await client.expect_error("invalid_text")
        assert (error["param"], error["event_id"]) == (path, f"evt_{i}"), error
    # Nothing else was sent for those frames: the next answer belongs to the next request.
    await client.send(type="conversation.item.retrieve", item_id="item_none", event_id="sync")
    assert (await client.expect_error("item_retrieve_invalid_item_id"))["event_id"] == "sync"
    assert await _normal_turn(client) == "completed"
    assert await asyncio.wait_for(other_turn, seconds(20)) == "completed"
    assert engine.unencodable == []
    await client.ws.close()
    await other.ws.close()


async def test_handler_failure_is_one_log_line_and_one_error(stub_server, caplog, monkeypatch):
    """A bug in a handler: one `server_error` for that request (its event_id), one ERROR line
    without traceback, and the session serves the next request."""
    server, _ = stub_server

    def broken(self, event, now):
        raise KeyError("boom\nsecond line")

    monkeypatch.setattr(ItemEvents, "on_delete", broken)  # a session opened from now on dispatches to it
    client = await _open(server.port, Dialect.GA)
    with caplog.at_level(logging.INFO):
        await client.send(type="conversation.item.delete", item_id="x", event_id="evt_bug")
        error = await client.expect_error("server_error")
    assert error["event_id"] == "evt_bug"
    failures = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(failures) == 1 and failures[0].exc_info is None
    line = failures[0].getMessage()
    assert "\n" not in line and "conversation.item.delete" in line and "evt_bug" in line and "KeyError" in line
    assert await _normal_turn(client) == "completed"
    await client.ws.close()


async def test_failure_on_a_turns_output_fails_only_that_response(stub_server, monkeypatch):
    """A bug while handling the engine's output: that response ends `failed` (server_error), the
    engine turn is cancelled, and the next response of the session completes."""
    from realtime_ming.session.response import ActiveResponse

    server, engine = stub_server

    def broken(self, text):
        raise RuntimeError("cannot render this delta")

    monkeypatch.setattr(ActiveResponse, "on_text", broken)
    client = await _open(server.port, Dialect.GA)
    await client.send(type="response.create", response={"output_modalities": ["text"]})
    done = (await client.recv_until("response.done", timeout=20))[-1]["response"]
    assert done["status"] == "failed" and done["status_details"]["error"]["code"] == "server_error"
    monkeypatch.undo()
    assert await _normal_turn(client) == "completed"
    assert engine.num_turns() == 0
    await client.ws.close()
