"""Function calling (issue 18): Ming's chat template rendering of tools / calls / results (compared with the
checkpoint's own Jinja template), the incremental call parser, and the engine path (tiny model, forced
reply and forced prefix): a call is parsed out of the stream, never spoken, and reported as call events."""

from __future__ import annotations

import threading

import pytest
from template_support import chat_template

from realtime_ming.engine import Engine
from realtime_ming.engine.api import (
    Content,
    Message,
    SamplingParams,
    TextDelta,
    ToolCall,
    ToolCallArguments,
    ToolCallEnd,
    ToolCallStart,
    TurnCancelled,
    TurnDone,
    TurnFailed,
    TurnRequest,
)
from realtime_ming.engine.config import EngineConfig, ThinkerRunnerConfig
from realtime_ming.engine.hooks import EngineHooks
from realtime_ming.engine.tool_calls import ToolCallParser
from realtime_ming.model.tiny_tokenizer import tiny_thinker_tokenizer
from realtime_ming.model.tokenizer import ChatMessage

pytestmark = pytest.mark.timeout(120)

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather of a city — now.",
                                             "parameters": {"type": "object",
                                                            "properties": {"city": {"type": "string"}}}}}
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


@pytest.mark.parametrize("calls", [1, 2])
def test_prompt_matches_the_checkpoint_template(calls):
    """Tools in the system turn, an assistant's text + calls, consecutive tool results: token-for-token text
    equal to the template's rendering, with the tool markers as their special tokens."""
    tok = tiny_thinker_tokenizer()
    args = ['{"city": "Paris"}', '{"city": "Lyon"}'][:calls]
    conversation = [
        ("user", "What's the weather in Paris?"),
        ("assistant", "Let me check.", args),
        *[("tool", f'{{"temp_c": {20 + i}}}') for i in range(calls)],
        ("user", "And tomorrow?"),
        ("assistant", "", ['{"city": "Paris", "day": "tomorrow"}']),
        ("tool", "sunny"),
    ]
    hf = [{"role": "system", "content": "You are terse."}]
    ours = []
    for role, content, *rest in conversation:
        if role == "assistant":
            hf.append({"role": role, "content": content,
                       "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": a}}
                                      for a in rest[0]]})
            ours.append(ChatMessage(role, (content,) if content else (),
                                    tool_calls=tuple(("get_weather", a) for a in rest[0])))
        else:
            hf.append({"role": role, "content": content})
            ours.append(ChatMessage(role, content))
    want = chat_template().render(messages=hf, tools=[WEATHER], add_generation_prompt=True)
    prompt = tok.build_prompt(ours, system="You are terse.", tools=[WEATHER])
    assert tok.decode(prompt.input_ids, skip_special_tokens=False) == want
    markers = tok.marker_ids()
    assert sum(1 for i in prompt.input_ids if markers.get(i) == "<tool_call>") == 2 + calls + 1  # the instructions name it twice
    assert sum(1 for i in prompt.input_ids if markers.get(i) == "<tool_response>") == calls + 1


def test_prompt_without_tools_is_unchanged():
    tok = tiny_thinker_tokenizer()
    msgs = [ChatMessage("user", "hi")]
    want = chat_template().render(messages=[{"role": "system", "content": "S"}, {"role": "user", "content": "hi"}],
                              add_generation_prompt=True)
    assert tok.decode(tok.build_prompt(msgs, system="S").input_ids, skip_special_tokens=False) == want


def _parse(text: str, step: int, names=("get_weather",)) -> list:
    parser, out = ToolCallParser("t", names), []
    for i in range(0, len(text), step):
        out += parser.feed(text[i:i + step])
    out += parser.finish()
    merged: list = []
    for piece in out:  # adjacent text / argument deltas merged: the split must not matter
        if merged and type(piece) is type(merged[-1]) and isinstance(piece, (str, ToolCallArguments)):
            merged[-1] = merged[-1] + piece if isinstance(piece, str) else ToolCallArguments("t", merged[-1].delta
                                                                                               + piece.delta)
        else:
            merged.append(piece)
    return merged


@pytest.mark.parametrize("step", [1, 2, 3, 7, 1000])
def test_parser_splits_text_and_call_at_any_chunking(step):
    out = _parse("Let me check. " + CALL + "\n" + CALL.replace("Paris", "Lyon"), step)
    assert out == ["Let me check. ",
                   ToolCallStart("t", "get_weather"), ToolCallArguments("t", '{"city": "Paris"}'),
                   ToolCallEnd("t", "get_weather", '{"city": "Paris"}'), "\n",
                   ToolCallStart("t", "get_weather"), ToolCallArguments("t", '{"city": "Lyon"}'),
                   ToolCallEnd("t", "get_weather", '{"city": "Lyon"}')]


def test_parser_streams_arguments_before_the_call_ends():
    parser = ToolCallParser("t", ["get_weather"])
    out = parser.feed('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par')
    assert out == [ToolCallStart("t", "get_weather"), ToolCallArguments("t", '{"city": "Par')]
    assert parser.feed('is"}') == [ToolCallArguments("t", 'is"')]  # the `}` may close the outer object: held
    assert parser.feed('}\n</tool_call>') == [ToolCallArguments("t", '}'),
                                              ToolCallEnd("t", "get_weather", '{"city": "Paris"}')]


@pytest.mark.parametrize("text,error", [
    ('<tool_call>{"name": "get_weather", "arguments": {"city": }}</tool_call>', "not JSON"),
    ('<tool_call>{"name": "launch", "arguments": {}}</tool_call>', "unknown function 'launch'"),
    ('<tool_call>{"name": "get_weather", "arguments": [1]}</tool_call>', "not a JSON object"),
    ('<tool_call>{"name": "get_weather", "arguments": {"city": "Pa', "unterminated"),
    ('<tool_call>not json at all</tool_call>', "not JSON"),
])
def test_parser_reports_malformed_calls_and_never_passes_them_as_text(text, error):
    out = _parse("Hi. " + text + " Bye.", 3)
    assert out[0] == "Hi. "
    ends = [p for p in out if isinstance(p, ToolCallEnd)]
    assert len(ends) == 1 and ends[0].arguments is None and error in ends[0].error
    spoken = "".join(p for p in out if isinstance(p, str))
    assert "tool_call" not in spoken and "get_weather" not in spoken and "launch" not in spoken


def test_parser_reorders_nothing_when_the_head_is_unusual():
    out = _parse('<tool_call>{"arguments": {"city": "Rome"}, "name": "get_weather"}</tool_call>', 4)
    assert out == [ToolCallStart("t", "get_weather"), ToolCallArguments("t", '{"city": "Rome"}'),
                   ToolCallEnd("t", "get_weather", '{"city": "Rome"}')]


# ---- the engine (tiny random model) ----------------------------------------------------------------------
class _Sink:
    def __init__(self):
        self.events, self.done = [], threading.Event()

    def __call__(self, event):
        self.events.append(event)
        if isinstance(event, (TurnDone, TurnCancelled, TurnFailed)):
            self.done.set()


def _turn(engine, turn_id, history, *, tools=(WEATHER,), prefix="", max_tokens=80, with_audio=True):
    sink = _Sink()
    engine.submit(TurnRequest(turn_id, "conv", tuple(history), sampling=SamplingParams(max_tokens=max_tokens),
                              tools=tools, forced_prefix=prefix, with_audio=with_audio), sink)
    assert sink.done.wait(90)
    return sink.events


@pytest.fixture(scope="module")
def forced_engine():
    reply = "Let me check. " + CALL + "<|role_end|>It is sunny in Paris.<|role_end|>"
    engine = Engine.create(EngineConfig(thinker=ThinkerRunnerConfig(max_seq_len=1024)),
                           hooks=EngineHooks(forced_reply=reply))
    yield engine
    engine.close()


def test_forced_tool_call_reply_gives_call_events_and_is_not_spoken(forced_engine):
    user = Message("user", (Content.of_text("Weather in Paris?"),))
    events = _turn(forced_engine, "t1", [user])
    calls = [e for e in events if isinstance(e, (ToolCallStart, ToolCallArguments, ToolCallEnd))]
    assert calls[0] == ToolCallStart("t1", "get_weather")
    assert "".join(e.delta for e in calls if isinstance(e, ToolCallArguments)) == '{"city": "Paris"}'
    assert calls[-1] == ToolCallEnd("t1", "get_weather", '{"city": "Paris"}')
    done = events[-1]
    assert isinstance(done, TurnDone) and done.text == "Let me check. " and done.audio_samples > 0
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == "Let me check. "
    # the call and its result enter the next prompt; the next forced segment answers
    history = [user, Message("assistant", (Content.of_text("Let me check."),),
                             tool_calls=(ToolCall("get_weather", '{"city": "Paris"}'),)),
               Message("tool", (Content.of_text('{"temp_c": 21}'),))]
    events = _turn(forced_engine, "t2", history)
    assert events[-1].text == "It is sunny in Paris." and not any(isinstance(e, ToolCallStart) for e in events)


def test_without_tools_a_call_is_cut_out_and_never_spoken(forced_engine):
    """No tools (tool_choice none, or tools not sent yet): a call the model writes anyway is still parsed
    out of the text — never spoken — and dropped: no call events, the turn ends normally."""
    user = Message("user", (Content.of_text("Weather?"),))
    events = _turn(forced_engine, "t3", [user], tools=(), with_audio=False)
    assert not any(isinstance(e, (ToolCallStart, ToolCallArguments, ToolCallEnd)) for e in events)
    assert events[-1].text == "Let me check. "


@pytest.fixture(scope="module")
def random_engine():
    engine = Engine.create(EngineConfig(thinker=ThinkerRunnerConfig(max_seq_len=1024)))
    yield engine
    engine.close()


def test_forced_prefix_makes_the_random_model_call_the_named_function(random_engine):
    """Constrained decoding: the reply starts with the call prefix whatever the weights sample."""
    user = Message("user", (Content.of_text("Weather in Paris?"),))
    plain = _turn(random_engine, "r0", [user], max_tokens=12, with_audio=False)
    assert not any(isinstance(e, ToolCallStart) for e in plain)
    events = _turn(random_engine, "r1", [user], prefix='<tool_call>\n{"name": "get_weather", "arguments": ',
                   max_tokens=80, with_audio=False)
    assert events[1:] and ToolCallStart("r1", "get_weather") in events
    ends = [e for e in events if isinstance(e, ToolCallEnd)]
    assert len(ends) == 1 and ends[0].name == "get_weather"  # random arguments: well formed or a clear error
    assert ends[0].arguments is not None or ends[0].error


# ---- constrained choice (tool_choice "required" over several tools) --------------------------------------
HEAD = '<tool_call>\n{"name": "'
NAMES = ("get_weather", "get_time", "lookup")


def test_forced_choices_allow_only_the_offered_names_token_by_token():
    from realtime_ming.engine.forced import allowed_tokens, forced_token, plan_forced

    tok = tiny_thinker_tokenizer()
    heads = tuple(f'{n}", "arguments": ' for n in NAMES)
    request = TurnRequest("c", "conv", (), forced_prefix=HEAD, forced_choices=heads)
    forced = plan_forced(tok, request, None)
    full = {n: tok.encode_markup(HEAD + h) for n, h in zip(NAMES, heads)}
    assert set(forced.choices) == {tuple(ids) for ids in full.values()}
    generated: list[int] = []
    common = len(tok.encode_markup(HEAD))  # the shared head: one allowed token, forced whatever is sampled
    for _ in range(common):
        (only,) = allowed_tokens(forced, generated)
        generated.append(forced_token(forced, generated, sampled=0))
        assert generated[-1] == only
    assert set(allowed_tokens(forced, generated)) == {full["get_weather"][common], full["lookup"][common]}
    # a sampled token no choice allows is replaced; an allowed one is kept (the model's choice)
    assert forced_token(forced, generated, sampled=full["lookup"][common]) == full["lookup"][common]
    assert forced_token(forced, generated, sampled=tok.eos_id) in allowed_tokens(forced, generated)
    generated.append(full["get_weather"][common])  # "g": get_weather and get_time stay open, lookup is out
    while (allowed := allowed_tokens(forced, generated)) is not None:
        generated.append(allowed[-1])
    assert tok.decode(generated).endswith('", "arguments": ') and any(generated == ids for ids in full.values())
    assert forced_token(forced, generated, sampled=7) == 7  # the choice is written: the model goes on freely
    # one choice is a plain forced prefix
    single = plan_forced(tok, TurnRequest("s", "conv", (), forced_prefix=HEAD, forced_choices=heads[:1]), None)
    assert single.ids == tuple(full["get_weather"]) and not single.choices


def test_mask_to_allowed_masks_only_constrained_rows():
    import torch

    from realtime_ming.engine.sampling import mask_to_allowed

    logits = torch.randn(3, 10)
    assert mask_to_allowed(logits, [None, None, None]) is logits
    masked = mask_to_allowed(logits, [None, (2, 5), (9,)])
    assert torch.equal(masked[0], logits[0])
    assert torch.isfinite(masked[1]).nonzero().flatten().tolist() == [2, 5]
    assert masked[1, 2] == logits[1, 2] and masked[2].argmax() == 9


def test_forced_choices_make_the_random_model_call_an_offered_function(random_engine):
    """`required` with several tools: whatever the random weights prefer, every call names an offered function,
    and sampling picks among them (seeded, temperature 1: both names appear over the seeds)."""
    user = Message("user", (Content.of_text("Weather or time?"),))
    tools = (WEATHER, {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}})
    heads = tuple(f'{t["function"]["name"]}", "arguments": ' for t in tools)
    names = []
    for seed in range(6):
        sink = _Sink()
        random_engine.submit(TurnRequest(f"q{seed}", f"conv-q{seed}", (user,), tools=tools, with_audio=False,
                                         sampling=SamplingParams(max_tokens=48, temperature=1.0, seed=seed),
                                         forced_prefix=HEAD, forced_choices=heads), sink)
        assert sink.done.wait(90)
        starts = [e for e in sink.events if isinstance(e, ToolCallStart)]
        assert len(starts) == 1, sink.events
        names.append(starts[0].name)
    assert set(names) == {"get_weather", "get_time"}, names
