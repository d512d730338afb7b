"""Budgets checked where settings are accepted (issue 43): instructions + tools, the speech style and the history's
token limit are measured in tokens (the engine's `PromptMeter` on the tiny model's tokenizers) at `session.update`
and `response.create`; a setting that would fail every turn is refused there with its code and param, the session
keeps what it had, and measuring megabytes of tools encodes only about a context's worth of them."""

from __future__ import annotations

import json

import pytest
from session_support import Harness, last_error

from realtime_ming.engine.config import TalkerRunnerConfig
from realtime_ming.engine.prompt_budget import ContextLengthExceeded
from realtime_ming.engine.prompt_meter import PromptMeter
from realtime_ming.model.tiny_tokenizer import build_tiny_talker_tokenizer, tiny_thinker_tokenizer
from realtime_ming.protocol.limits import MAX_SCHEMA_JSON_BYTES, MAX_TEXT_CHARS, MAX_TOOLS, MAX_TOOLS_JSON_BYTES
from realtime_ming.session import SessionSettings, SubmitTurn

MAX_SEQ_LEN = 4096
TEXT_ONLY = {"type": "realtime", "output_modalities": ["text"], "audio": {"input": {"turn_detection": None}}}


class _CountingMeter(PromptMeter):
    """The engine's meter on the tiny tokenizers, counting the characters it encoded."""

    def __init__(self) -> None:
        tok = tiny_thinker_tokenizer()
        self.encoded_chars = 0
        encode = tok.encode

        def counted(text: str) -> list[int]:
            self.encoded_chars += len(text)
            return encode(text)

        tok.encode = counted
        talker = build_tiny_talker_tokenizer()
        super().__init__(tok, lambda text: talker.encode(text, add_special_tokens=False).ids, max_seq_len=MAX_SEQ_LEN,
                         caption_budget=TalkerRunnerConfig().caption_budget)


def _big_tool(i: int) -> dict:
    """A tool at the protocol's size limits: an 8 KiB description and a schema of almost 64 KiB."""
    properties = {f"p{k}": {"type": "string", "description": "word " * 120} for k in range(100)}
    return {"type": "function", "name": f"tool_{i}", "description": "d " * 4096,
            "parameters": {"type": "object", "properties": properties}}


def _harness(**settings) -> tuple[Harness, _CountingMeter]:
    meter = _CountingMeter()
    h = Harness(settings=SessionSettings(**settings), prompt_meter=meter)
    h.send(type="session.update", session=TEXT_ONLY)
    return h, meter


def _refused(h: Harness, since: int, code: str, param: str, event_id: str) -> dict:
    assert h.types(since) == ["error"], h.types(since)
    error = last_error(h)
    assert (error["code"], error["param"], error["event_id"]) == (code, param, event_id), error
    return error


def test_tools_past_the_context_are_refused_at_update_after_a_bounded_measure():
    """12 tools at every per-tool limit (~0.9 MB, under the tools' 1 MiB size limit, far past the context):
    instructions_exceed_context at session.tools, the session keeps its tools, and measuring encoded about a
    context's worth of text, not the whole; 128 of them (~9 MB) are over the size limit itself and refused
    before anything is measured (tools_too_large, issue 43)."""
    h, meter = _harness()
    tools = [_big_tool(i) for i in range(12)]
    assert 512 * 1024 < len(json.dumps(tools)) < MAX_TOOLS_JSON_BYTES
    assert len(str(_big_tool(0)["parameters"])) < MAX_SCHEMA_JSON_BYTES
    since = len(h.frames)
    h.send(type="session.update", event_id="u1", session={"type": "realtime", "tools": tools})
    error = _refused(h, since, "instructions_exceed_context", "session.tools", "u1")
    assert "4096-token context" in error["message"]
    assert meter.encoded_chars < 4 * MAX_SEQ_LEN + 16384  # a context's worth and at most one more piece
    assert h.session.config.tools == ()
    encoded, since = meter.encoded_chars, len(h.frames)
    h.send(type="session.update", event_id="u2", session={
        "type": "realtime", "tools": [_big_tool(i) for i in range(MAX_TOOLS)]})
    _refused(h, since, "tools_too_large", "session.tools", "u2")
    assert meter.encoded_chars == encoded and h.session.config.tools == ()
    h.send(type="conversation.item.create", item={"type": "message", "role": "user",
                                                  "content": [{"type": "input_text", "text": "hi"}]})
    h.send(type="response.create")
    assert len(h.submitted()) == 1 and h.submitted()[0].tools == ()


def test_tools_that_fit_are_accepted_and_measured_once():
    """A normal tool set is accepted; the next updates and responses with it measure nothing again."""
    h, meter = _harness()
    tool = {"type": "function", "name": "get_weather", "description": "The weather of a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}
    h.send(type="session.update", session={"type": "realtime", "tools": [tool]})
    assert h.types()[-1] == "session.updated"
    encoded = meter.encoded_chars
    h.send(type="session.update", session={"type": "realtime", "instructions": ""})
    h.send(type="response.create", response={"max_output_tokens": 64})
    assert h.types()[-1] != "error" and meter.encoded_chars == encoded


def test_instructions_filling_the_context_are_refused():
    """Instructions of MAX_TEXT_CHARS characters (byte-level tiny tokenizer: that many tokens) at session.instructions."""
    h, _ = _harness()
    since = len(h.frames)
    h.send(type="session.update", event_id="u2", session={"type": "realtime", "instructions": "x" * MAX_TEXT_CHARS})
    _refused(h, since, "instructions_exceed_context", "session.instructions", "u2")
    assert h.session.config.instructions == ""


def test_a_larger_reply_that_leaves_no_room_blames_max_output_tokens():
    """Instructions that fit with short replies: raising max_output_tokens so the conversation has no room left is
    refused at session.max_output_tokens (the engine keeps min(max_output_tokens, context / 2) for the reply)."""
    h, _ = _harness(max_output_tokens=64)
    h.send(type="session.update", session={"type": "realtime", "instructions": "y " * 1900, "max_output_tokens": 64})
    assert h.types()[-1] == "session.updated"
    since = len(h.frames)
    h.send(type="session.update", event_id="u3", session={"type": "realtime", "max_output_tokens": 2048})
    error = _refused(h, since, "instructions_exceed_context", "session.max_output_tokens", "u3")
    assert "2048 tokens kept for the reply" in error["message"]
    since = len(h.frames)
    h.send(type="response.create", event_id="r3", response={"max_output_tokens": 2048})
    _refused(h, since, "instructions_exceed_context", "response.max_output_tokens", "r3")
    assert h.submitted() == []


def test_post_instructions_below_the_conversation_minimum_is_refused():
    h, _ = _harness()
    since = len(h.frames)
    h.send(type="session.update", event_id="u4", session={"type": "realtime", "truncation": {
        "type": "retention_ratio", "retention_ratio": 0.5, "token_limits": {"post_instructions": 1}}})
    error = _refused(h, since, "token_limit_too_small", "session.truncation.token_limits.post_instructions", "u4")
    assert "less than the 64 tokens" in error["message"]
    h.send(type="session.update", session={"type": "realtime", "truncation": {
        "type": "retention_ratio", "retention_ratio": 0.5, "token_limits": {"post_instructions": 64}}})
    assert h.types()[-1] == "session.updated"


def test_speech_style_over_the_talker_caption_budget_is_refused_where_it_is_set():
    """A 300-character style (within its character limit) makes a caption over the talker's budget: refused at
    session.update and as a response.create override, with the talker-token counts in the message."""
    h, meter = _harness()
    style = {"style": "温柔" * 150}
    since = len(h.frames)
    h.send(type="session.update", event_id="u5", session={"type": "realtime", "realtime_ming": {"speech": style}})
    error = _refused(h, since, "speech_style_too_long", "session.realtime_ming.speech", "u5")
    assert f"at most {meter.caption_budget}" in error["message"]
    assert h.session.config.speech is None
    since = len(h.frames)
    h.send(type="response.create", event_id="r5", response={"realtime_ming": {"speech": style}})
    _refused(h, since, "speech_style_too_long", "response.realtime_ming.speech", "r5")


def test_response_tools_override_over_the_context_is_refused_and_nothing_starts():
    h, _ = _harness()
    h.send(type="conversation.item.create", item={"type": "message", "role": "user",
                                                  "content": [{"type": "input_text", "text": "hi"}]})
    since = len(h.frames)
    h.send(type="response.create", event_id="r6", response={"tools": [_big_tool(i) for i in range(8)]})
    _refused(h, since, "instructions_exceed_context", "response.tools", "r6")
    assert not any(isinstance(c, SubmitTurn) for c in h.commands)
    h.send(type="response.create")
    assert len(h.submitted()) == 1


def test_engine_meter_refuses_an_oversized_system_turn_without_encoding_it_all():
    """The engine side (every turn's prompt): a system turn over the context raises context_length_exceeded after
    encoding about a context's worth; one that fits is encoded once and its ids are reused."""
    meter = _CountingMeter()
    tools = tuple({"type": "function", "function": {"name": f"t{i}", "description": "z " * 30000}} for i in range(64))
    with pytest.raises(ContextLengthExceeded):
        meter.system_ids("Be brief.", tools)
    assert meter.encoded_chars < 4 * MAX_SEQ_LEN + 16384
    ids = meter.system_ids("Be brief.", tools[:0])
    encoded = meter.encoded_chars
    assert meter.system_ids("Be brief.", ()) is ids and meter.encoded_chars == encoded
    assert meter.system_tokens("Be brief.", ()) == len(ids) + len(meter.tokenizer.build_prompt([], system_ids=()).input_ids)
