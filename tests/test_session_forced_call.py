"""A forced function call (tool_choice required / named) is the response's first output item: no empty
assistant message before it; text after the call opens the message then, at the next output index."""

from __future__ import annotations

import pytest
from session_support import Harness, engine_pcm

from realtime_ming.engine.api import (
    AudioChunk,
    FinishReason,
    TextDelta,
    ToolCallArguments,
    ToolCallEnd,
    ToolCallStart,
    TurnDone,
)

WEATHER = {"type": "function", "name": "get_weather", "parameters": {"type": "object", "properties": {}}}


def _call_turn(h: Harness, tool_choice, *, text_after: str = "", audio: bool = False) -> tuple[str, int]:
    """A text response whose engine turn writes one get_weather call (then `text_after`); its id and first frame."""
    h.send(type="session.update", session={"type": "realtime", "tools": [WEATHER],
                                           "audio": {"input": {"turn_detection": None}}})
    h.send(type="conversation.item.create", item={"type": "message", "role": "user",
                                                  "content": [{"type": "input_text", "text": "Weather?"}]})
    start = len(h.frames)
    h.send(type="response.create", response={"tool_choice": tool_choice,
                                             "output_modalities": ["audio" if audio else "text"]})
    turn = h.submitted()[-1].turn_id
    h.engine(ToolCallStart(turn, "get_weather"))
    h.engine(ToolCallArguments(turn, '{"city": "Paris"}'))
    h.engine(ToolCallEnd(turn, "get_weather", '{"city": "Paris"}'))
    if text_after:
        h.engine(TextDelta(turn, text_after))
    if audio:
        h.engine(AudioChunk(turn, engine_pcm(0.2)))
    h.engine(TurnDone(turn, text_after, FinishReason.STOP, 12, 4, 3, 0, {}))
    return turn, start


@pytest.mark.parametrize("choice", ["required", {"type": "function", "name": "get_weather"}])
def test_forced_call_adds_no_empty_message(choice):
    """Only the function_call item is output (index 0) and added to the conversation."""
    h = Harness()
    _, start = _call_turn(h, choice)
    frames = h.frames[start:]
    added = [f for f in frames if f["type"] in ("response.output_item.added", "conversation.item.added")]
    assert [(f["type"], f["item"]["type"]) for f in added] == [
        ("response.output_item.added", "function_call"), ("conversation.item.added", "function_call")]
    assert added[0]["output_index"] == 0
    assert not any(f["type"].startswith(("response.content_part", "response.output_text")) for f in frames)
    done = h.last("response.done")["response"]
    assert [item["type"] for item in done["output"]] == ["function_call"] and done["status"] == "completed"
    h.send(type="conversation.item.retrieve", item_id=added[0]["item"]["id"])
    assert h.last("conversation.item.retrieved")["item"]["type"] == "function_call"


@pytest.mark.parametrize("audio", [False, True])
def test_text_after_a_forced_call_opens_the_message_after_it(audio):
    """The model answers after the call: the message is output item 1, after the call in the conversation too."""
    h = Harness()
    _, start = _call_turn(h, "required", text_after="Sunny.", audio=audio)
    frames = h.frames[start:]
    added = [f for f in frames if f["type"] == "response.output_item.added"]
    assert [(f["item"]["type"], f["output_index"]) for f in added] == [("function_call", 0), ("message", 1)]
    conv = [f for f in frames if f["type"] == "conversation.item.added"]
    assert conv[1]["previous_item_id"] == conv[0]["item"]["id"]
    done_items = {f["item"]["type"]: f["output_index"] for f in frames if f["type"] == "response.output_item.done"}
    assert done_items == {"function_call": 0, "message": 1}
    output = h.last("response.done")["response"]["output"]
    assert [item["type"] for item in output] == ["function_call", "message"]


def test_auto_tool_choice_keeps_the_message_first():
    """tool_choice auto: the message item is announced with the response (index 0), the call follows (index 1)."""
    h = Harness()
    _, start = _call_turn(h, "auto")
    added = [f for f in h.frames[start:] if f["type"] == "response.output_item.added"]
    assert [(f["item"]["type"], f["output_index"]) for f in added] == [("message", 0), ("function_call", 1)]
