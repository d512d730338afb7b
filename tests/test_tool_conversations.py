"""Conversations with function calls, as the protocol allows them, become the prompt the checkpoint's chat template
renders (issue 43): parallel calls, consecutive results, results without a call, a second round of calls — from
the session's conversation items through the engine's input processor, compared with the Jinja template's text.
Truncation cuts such a history only between units (a call turn stays with its results)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from template_support import chat_template

from realtime_ming.engine.api import Content, SamplingParams, Truncation, TurnRequest
from realtime_ming.engine.input_processor import InputProcessor
from realtime_ming.engine.prompt_budget import segment_starts, unit_starts
from realtime_ming.model.tiny_tokenizer import tiny_thinker_tokenizer
from realtime_ming.protocol.items import (
    FunctionCallItem,
    FunctionCallOutputItem,
    InputText,
    ItemStatus,
    MessageItem,
    Role,
)
from realtime_ming.session.conversation import AssistantItem, Conversation, StoredItem

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather of a city.",
                                             "parameters": {"type": "object",
                                                            "properties": {"city": {"type": "string"}}}}}
SYSTEM = "You are terse."


def _user(text: str) -> StoredItem:
    item = MessageItem(role=Role.USER, content=(InputText(text),), id=f"u_{abs(hash(text))}",
                       status=ItemStatus.COMPLETED)
    return StoredItem(item, (Content.of_text(text),))


def _call(call_id: str, city: str) -> StoredItem:
    return StoredItem(FunctionCallItem(name="get_weather", arguments=f'{{"city": "{city}"}}', call_id=call_id,
                                       id=f"fc_{call_id}", status=ItemStatus.COMPLETED))


def _output(call_id: str, text: str) -> StoredItem:
    return StoredItem(FunctionCallOutputItem(call_id=call_id, output=text, id=f"out_{call_id}"))


def _said(item_id: str, text: str) -> AssistantItem:
    return AssistantItem(item_id, is_audio=False, text=text, status=ItemStatus.COMPLETED)


def _hf_call(city: str) -> dict:
    return {"type": "function", "function": {"name": "get_weather", "arguments": f'{{"city": "{city}"}}'}}


# (conversation items in order, the same conversation as chat-completions messages for the template)
CASES = {
    "parallel calls then their results": (
        [_user("Weather in Paris and Lyon?"), _call("a", "Paris"), _call("b", "Lyon"),
         _output("a", "sunny"), _output("b", "rain")],
        [{"role": "user", "content": "Weather in Paris and Lyon?"},
         {"role": "assistant", "content": "", "tool_calls": [_hf_call("Paris"), _hf_call("Lyon")]},
         {"role": "tool", "content": "sunny"}, {"role": "tool", "content": "rain"}]),
    "results in another order": (
        [_user("Weather in Paris and Lyon?"), _call("a", "Paris"), _call("b", "Lyon"),
         _output("b", "rain"), _output("a", "sunny")],
        [{"role": "user", "content": "Weather in Paris and Lyon?"},
         {"role": "assistant", "content": "", "tool_calls": [_hf_call("Paris"), _hf_call("Lyon")]},
         {"role": "tool", "content": "rain"}, {"role": "tool", "content": "sunny"}]),
    "consecutive results without calls": (
        [_user("Here are two results."), _output("x", "one"), _output("y", "two")],
        [{"role": "user", "content": "Here are two results."},
         {"role": "tool", "content": "one"}, {"role": "tool", "content": "two"}]),
    "alternating calls and results": (
        [_user("Paris, then Lyon?"), _call("a", "Paris"), _output("a", "sunny"), _call("b", "Lyon"),
         _output("b", "rain")],
        [{"role": "user", "content": "Paris, then Lyon?"},
         {"role": "assistant", "content": "", "tool_calls": [_hf_call("Paris")]}, {"role": "tool", "content": "sunny"},
         {"role": "assistant", "content": "", "tool_calls": [_hf_call("Lyon")]}, {"role": "tool", "content": "rain"}]),
    "text with parallel calls, an answer, a second round": (
        [_user("Paris and Lyon?"), _said("m1", "Let me check."), _call("a", "Paris"), _call("b", "Lyon"),
         _output("a", "sunny"), _output("b", "rain"), _said("m2", "Sunny, then rain."), _user("And Nice?"),
         _call("c", "Nice"), _output("c", "windy")],
        [{"role": "user", "content": "Paris and Lyon?"},
         {"role": "assistant", "content": "Let me check.", "tool_calls": [_hf_call("Paris"), _hf_call("Lyon")]},
         {"role": "tool", "content": "sunny"}, {"role": "tool", "content": "rain"},
         {"role": "assistant", "content": "Sunny, then rain."}, {"role": "user", "content": "And Nice?"},
         {"role": "assistant", "content": "", "tool_calls": [_hf_call("Nice")]}, {"role": "tool", "content": "windy"}]),
}


def _history(items) -> tuple:
    conversation = Conversation(max_items=64)
    for item in items:
        conversation.insert(item)
    return conversation.history()


def _processor(max_seq_len: int = 4096) -> InputProcessor:
    return InputProcessor(SimpleNamespace(tokenizer=tiny_thinker_tokenizer()), max_seq_len=max_seq_len, workers=1)


@pytest.mark.parametrize("case", CASES)
def test_conversation_prompt_matches_the_checkpoint_template(case):
    """The prompt of a protocol conversation with calls and results decodes to the template's rendering of it."""
    items, hf = CASES[case]
    processor = _processor()
    prepared = processor.prepare(TurnRequest("t", "c", _history(items), system=SYSTEM, tools=(WEATHER,)))
    want = chat_template().render(messages=[{"role": "system", "content": SYSTEM}, *hf], tools=[WEATHER],
                                  add_generation_prompt=True)
    assert processor.tok.decode(prepared.prompt.input_ids, skip_special_tokens=False) == want


def test_segments_and_units_follow_the_template_turns():
    """Consecutive results share one role segment; a result never opens a unit (it stays with its call)."""
    roles = ["user", "assistant", "tool", "tool", "assistant", "user", "assistant", "tool"]
    assert segment_starts(roles) == [0, 1, 2, 4, 5, 6, 7]
    assert unit_starts(roles) == [0, 1, 4, 5, 6]
    assert unit_starts(["tool", "tool", "user"]) == [0, 2]


@pytest.mark.parametrize("policy", [Truncation("auto"), Truncation("retention_ratio", 0.5)])
def test_truncation_keeps_calls_with_their_results(policy):
    """A history with parallel calls over a small context is cut at a unit: the kept prompt is the template's
    rendering of a suffix that starts with a user or assistant message, never with a lone result."""
    items, hf = [], []
    for turn in range(6):
        items += [_user(f"Turn {turn}: weather in Paris and Lyon?"), _call(f"a{turn}", "Paris"),
                  _call(f"b{turn}", "Lyon"), _output(f"a{turn}", "sunny " * 4), _output(f"b{turn}", "rain " * 4)]
        hf += [{"role": "user", "content": f"Turn {turn}: weather in Paris and Lyon?"},
               {"role": "assistant", "content": "", "tool_calls": [_hf_call("Paris"), _hf_call("Lyon")]},
               {"role": "tool", "content": "sunny " * 4}, {"role": "tool", "content": "rain " * 4}]
    processor = _processor(max_seq_len=1024)
    prepared = processor.prepare(TurnRequest("t", "c", _history(items), system=SYSTEM, tools=(WEATHER,),
                                             sampling=SamplingParams(max_tokens=16), truncation=policy))
    text = processor.tok.decode(prepared.prompt.input_ids, skip_special_tokens=False)
    assert len(prepared.prompt.input_ids) <= 1024 - 16
    suffixes = {start: chat_template().render(messages=[{"role": "system", "content": SYSTEM}, *hf[start:]],
                                              tools=[WEATHER], add_generation_prompt=True)
                for start in range(1, len(hf))}
    kept = [start for start, rendered in suffixes.items() if rendered == text]
    assert len(kept) == 1 and hf[kept[0]]["role"] != "tool", kept
