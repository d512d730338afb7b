"""The `truncation` policy: the cut over history segment lengths, and the real thinker runner at a small context.

The runner tests use the engine on the embedded tiny model with a 256-token context so that a long
conversation crosses it within a few turns; token counts come from the engine's own tokenizer.
"""

from __future__ import annotations

import threading
from dataclasses import replace

import pytest
from conftest import tiny_engine, tiny_engine_fixture

from realtime_ming.engine.api import (
    Content,
    FailureCode,
    Message,
    SamplingParams,
    Truncation,
    TurnDone,
    TurnFailed,
    TurnRequest,
)
from realtime_ming.engine.prompt_budget import (
    ContextLengthExceeded,
    history_cut,
    prompt_budget,
    segment_lengths,
)

AUTO, DISABLED = Truncation("auto"), Truncation("disabled")


def test_budget_reserves_the_reply_or_half_the_context():
    assert prompt_budget(4096, 512) == 3584
    assert prompt_budget(256, 512) == 128
    assert prompt_budget(256, 8) == 248


def test_auto_drops_the_fewest_oldest_messages():
    assert history_cut([10, 10, 10], 30, AUTO) == 0
    assert history_cut([10, 10, 10, 10], 30, AUTO) == 1
    assert history_cut([25, 5, 5, 10], 30, AUTO) == 1  # 5 + 5 + 10 fits


def test_retention_ratio_keeps_the_cut_until_the_limit_is_crossed_again():
    policy = Truncation("retention_ratio", 0.5)
    lengths = [10] * 11  # crossing 100 at the 11th message: drop down to <= 50 tokens
    cut = history_cut(lengths, 100, policy)
    assert cut == 6 and sum(lengths[cut:]) == 50
    # the next turns extend the history: the same cut (the cached prefix stays valid) until 100 is crossed
    for extra in range(1, 6):
        assert history_cut(lengths + [10] * extra, 100, policy) == cut
    assert history_cut(lengths + [10] * 6, 100, policy) == 12


def test_retention_ratio_zero_keeps_only_the_newest_message():
    assert history_cut([10, 10, 10, 10], 30, Truncation("retention_ratio", 0.0)) == 3


def test_disabled_and_oversized_newest_message_fail_with_the_code():
    with pytest.raises(ContextLengthExceeded) as info:
        history_cut([10, 10, 11], 30, DISABLED)
    assert info.value.code == "context_length_exceeded"
    assert history_cut([10, 10, 10], 30, DISABLED) == 0
    with pytest.raises(ContextLengthExceeded):
        history_cut([5, 31], 30, AUTO)


def test_segment_lengths_split_at_role_tokens():
    role = 7
    ids = [7, 1, 1, 1, 7, 2, 2, 7, 3, 7, 4]  # system(4), two messages (3, 2), generation prompt (2)
    assert segment_lengths(ids, role, 2) == (6, [3, 2])
    with pytest.raises(ValueError):
        segment_lengths(ids, role, 3)


# ---- the real thinker runner ------------------------------------------------------------------------------
MAX_SEQ_LEN = 256


engine = tiny_engine_fixture(max_seq_len=MAX_SEQ_LEN, max_slots=4)


def _run(engine, request: TurnRequest):
    done, result = threading.Event(), []

    def sink(event):
        if isinstance(event, (TurnDone, TurnFailed)):
            result.append(event)
            done.set()

    engine.submit(request, sink)
    assert done.wait(60)
    return result[0]


def _user(text: str) -> Message:
    return Message("user", (Content.of_text(text),))


def _request(turn: int, history, policy: Truncation, max_tokens: int = 8) -> TurnRequest:
    return TurnRequest(f"t{turn}-{policy.mode}", f"conv-{policy.mode}", tuple(history), system="Be brief.",
                       sampling=SamplingParams(max_tokens=max_tokens), with_audio=False, truncation=policy)


@pytest.mark.slow  # the full tier: a many-turn conversation
def test_long_conversation_keeps_answering_with_auto(engine):
    """60 text turns well past a 256-token context: every turn completes and its prompt fits the budget."""
    history, prompts, cached = [], [], []
    for turn in range(60):
        history.append(_user(f"This is user turn number {turn}, please answer briefly."))
        event = _run(engine, _request(turn, history, AUTO))
        assert isinstance(event, TurnDone), event
        assert event.prompt_tokens <= prompt_budget(MAX_SEQ_LEN, 8)
        prompts.append(event.prompt_tokens)
        cached.append(event.cached_tokens)
        history.append(Message("assistant", (Content.of_text(event.text or "ok"),)))
    assert max(prompts) > MAX_SEQ_LEN // 2  # the context was really filled, so truncation really ran


def test_retention_ratio_keeps_the_prefix_cached_between_cuts(engine):
    """With retention_ratio 0.5 most turns after the first cut reuse the cached prefix."""
    policy = Truncation("retention_ratio", 0.5)
    history, hits = [], []
    for turn in range(40):
        history.append(_user(f"User message {turn}: tell me something."))
        event = _run(engine, _request(turn, history, policy))
        assert isinstance(event, TurnDone), event
        hits.append(event.cached_tokens > 10)  # more than the system turn
        history.append(Message("assistant", (Content.of_text(event.text or "ok"),)))
    assert sum(hits[20:]) >= 14, hits


@pytest.fixture(scope="module")
def engine_1k():
    """The tiny engine at a 1024-token context: a quarter of it holds several turns."""
    eng = tiny_engine(max_seq_len=1024, max_slots=2)
    yield eng
    eng.close()


@pytest.mark.parametrize("forget", [False, True])
def test_auto_cuts_once_and_the_next_turns_reuse_the_prefix(engine_1k, forget):
    """`auto` on a full context (issue 43): a turn either reuses the whole previous prompt (prefills only its new
    messages, at most a quarter of the context) or is one of the few cut turns; the cut leaves the history at
    engine.thinker.auto_truncation_ratio (0.75) of its limit, so cuts come every few turns, not every turn — also
    when the session forgets its oldest items every turn (`max_items`), which shifts where the history begins."""
    history, prompts, cached = [], [], []
    for turn in range(48):
        history.append(_user(f"User message {turn}: tell me something about the weather."))
        if forget and len(history) > 30:
            del history[:2]
        event = _run(engine_1k, replace(_request(turn, history, AUTO), conversation_id=f"conv-forget-{forget}"))
        assert isinstance(event, TurnDone), event
        prompts.append(event.prompt_tokens)
        cached.append(event.cached_tokens)
        history.append(Message("assistant", (Content.of_text(event.text or "ok"),)))
    full = next(i for i, n in enumerate(prompts) if n > 0.75 * max(prompts))
    cuts = [i for i in range(full + 1, len(prompts)) if cached[i] < prompts[i - 1]]
    assert max(prompts) > 1024 // 2 and len(prompts) - full > 12  # the context was really full, for a while
    assert len(cuts) <= (len(prompts) - full) // 3, (cuts, prompts, cached)
    for i in set(range(full + 1, len(prompts))) - set(cuts):
        assert prompts[i] - cached[i] <= 1024 // 4, (i, prompts, cached)
    for i in cuts:  # a cut keeps the history at about 0.75 of its limit (the system turn is the cached part)
        assert prompts[i] < 0.9 * max(prompts), (i, prompts)


def test_disabled_fails_with_the_code_and_a_shorter_request_works(engine):
    long_text = " ".join(f"word{i}" for i in range(400))
    event = _run(engine, _request(0, [_user(long_text)], DISABLED))
    assert isinstance(event, TurnFailed) and event.code is FailureCode.CONTEXT_LENGTH_EXCEEDED, event
    event = _run(engine, _request(1, [_user("short")], DISABLED))
    assert isinstance(event, TurnDone), event
    # auto cannot drop the newest message either: the same clear code, not a generic failure
    event = _run(engine, replace(_request(2, [_user(long_text)], AUTO)))
    assert isinstance(event, TurnFailed) and event.code is FailureCode.CONTEXT_LENGTH_EXCEEDED, event
