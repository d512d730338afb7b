"""No silent acceptance (README "Protocol support"): every field the server accepts has an observable
effect, or the request gets an `error` with a specific code and param — in both dialects.

Driven through the Sans-I/O session with wire frames (tests/session_support.py's `Harness`, which validates
every emitted frame against the openai package's GA / beta server-event unions).
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
from session_support import Harness

from realtime_ming.engine.api import (
    AudioChunk,
    FinishReason,
    PromptTokens,
    TextDelta,
    TurnDone,
)
from realtime_ming.protocol import Dialect
from realtime_ming.session import CancelTurn, SessionSettings

GA, BETA = Dialect.GA, Dialect.BETA


def _session(dialect: Dialect, **fields) -> dict:
    return {"type": "realtime", **fields} if dialect is GA else fields


def _text_only(dialect: Dialect) -> dict:
    return {"output_modalities": ["text"]} if dialect is GA else {"modalities": ["text"]}


def _errors(h: Harness, since: int = 0) -> list[dict]:
    return [f["error"] for f in h.frames[since:] if f["type"] == "error"]


def _done(turn_id: str, **kw) -> TurnDone:
    return TurnDone(turn_id, "Hi", FinishReason.STOP, 30, 10, 2, 0, {}, **kw)


# ---- session.model ------------------------------------------------------------------------------


@pytest.mark.parametrize("requested", ["gpt-realtime", "gpt-4o-realtime-preview", "ming-test"])
def test_session_model_reports_the_served_model(requested: str) -> None:
    """Clients name their model ("gpt-realtime"); the session keeps working and reports the served one."""
    h = Harness()
    h.send(type="session.update", session={"type": "realtime", "model": requested, "instructions": "x"})
    assert not _errors(h)
    assert h.last("session.updated")["session"]["model"] == "ming-test"
    assert h.session.config.model == "ming-test"


def test_beta_session_model_is_accepted_and_not_echoed() -> None:
    """Beta clients send an OpenAI model id; the beta session object has no room for ours (SDK literal)."""
    h = Harness(BETA)
    h.send(type="session.update", session={"model": "gpt-4o-realtime-preview", "instructions": "x"})
    assert not _errors(h) and "model" not in h.last("session.updated")["session"]
    assert h.session.config.model == "ming-test"


# ---- unsupported documented fields: prompt, include, reasoning -----------------------------------


@pytest.mark.parametrize(("field", "value", "param"), [
    ("prompt", {"id": "pmpt_123", "variables": {"city": "Paris"}}, "session.prompt"),
    ("include", ["item.input_audio_transcription.logprobs"], "session.include[0]"),
    ("reasoning", {"effort": "low"}, "session.reasoning"),
    ("parallel_tool_calls", False, "session.parallel_tool_calls"),
])
def test_ga_session_unsupported_fields_are_refused(field: str, value, param: str) -> None:
    h = Harness()
    before = h.session.config
    h.send(type="session.update", event_id="e1", session={"type": "realtime", "instructions": "new", field: value})
    (error,) = _errors(h)
    assert (error["code"], error["param"], error["event_id"]) == ("unsupported_parameter", param, "e1")
    assert h.session.config == before  # nothing of the update applied


@pytest.mark.parametrize(("field", "value"), [("prompt", None), ("prompt", {}), ("include", []), ("include", None),
                                              ("reasoning", None), ("parallel_tool_calls", None),
                                              ("parallel_tool_calls", True)])
def test_ga_session_empty_values_of_unsupported_fields_are_accepted(field: str, value) -> None:
    h = Harness()
    h.send(type="session.update", session={"type": "realtime", "instructions": "new", field: value})
    assert not _errors(h) and h.session.config.instructions == "new"


@pytest.mark.parametrize("field", ["prompt", "include"])
def test_beta_session_ga_only_fields_are_unknown_parameters(field: str) -> None:
    h = Harness(BETA)
    h.send(type="session.update", session={field: None})
    (error,) = _errors(h)
    assert (error["code"], error["param"]) == ("unknown_parameter", f"session.{field}")


@pytest.mark.parametrize(("field", "value"), [("prompt", {"id": "pmpt_1"}), ("reasoning", {"effort": "high"}),
                                              ("parallel_tool_calls", False)])
def test_ga_response_unsupported_fields_are_refused(field: str, value) -> None:
    h = Harness()
    h.send(type="response.create", event_id="r1", response={field: value})
    (error,) = _errors(h)
    assert (error["code"], error["param"], error["event_id"]) == ("unsupported_parameter", f"response.{field}", "r1")
    assert not h.submitted() and "response.created" not in h.types()


# ---- temperature ------------------------------------------------------------------------------------


@pytest.mark.parametrize("dialect", list(Dialect))
def test_response_temperature_is_the_turns_sampling_temperature(dialect: Dialect) -> None:
    """`response.create` `temperature` (beta schema; GA clients ported from beta send it too) sets the
    thinker's sampling temperature of that response only; the next one uses the session's."""
    h = Harness(dialect, SessionSettings(temperature=0.8))
    h.send(type="response.create", response={"temperature": 0.65, **_text_only(dialect)})
    first = h.submitted()[-1]
    h.engine(_done(first.turn_id))
    h.send(type="response.create", response=_text_only(dialect))
    assert (first.sampling.temperature, h.submitted()[-1].sampling.temperature) == (0.65, 0.8)


@pytest.mark.parametrize("dialect", list(Dialect))
def test_response_temperature_out_of_range_is_invalid_value(dialect: Dialect) -> None:
    h = Harness(dialect)
    h.send(type="response.create", response={"temperature": 1.7})
    (error,) = _errors(h)
    assert (error["code"], error["param"]) == ("invalid_value", "response.temperature")


# ---- tracing -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("dialect", list(Dialect))
def test_tracing_logs_one_record_per_response(dialect: Dialect, caplog) -> None:
    """With tracing set, each finished response is logged on `realtime_ming.tracing` with the client's
    workflow name, group id and metadata and the response's usage; without, nothing is logged."""
    h = Harness(dialect)
    caplog.set_level(logging.INFO, logger="realtime_ming.tracing")
    h.send(type="response.create", response=_text_only(dialect))
    h.engine(_done(h.submitted()[-1].turn_id))
    assert not caplog.records
    tracing = {"workflow_name": "support-bot", "group_id": "g-7", "metadata": {"customer": "42"}}
    h.send(type="session.update", session=_session(dialect, tracing=tracing))
    h.send(type="response.create", response=_text_only(dialect))
    turn_id = h.submitted()[-1].turn_id
    h.engine(_done(turn_id))
    (record,) = caplog.records
    trace = record.trace
    assert (trace["workflow_name"], trace["group_id"], trace["metadata"]) == ("support-bot", "g-7", {"customer": "42"})
    assert trace["response_id"] == turn_id == h.last("response.done")["response"]["id"]
    assert trace["status"] == "completed" and trace["usage"]["input_tokens"] == 30


def test_tracing_auto_uses_the_default_workflow_name(caplog) -> None:
    h = Harness()
    caplog.set_level(logging.INFO, logger="realtime_ming.tracing")
    h.send(type="session.update", session={"type": "realtime", "tracing": "auto"})
    h.send(type="response.create", response={"output_modalities": ["text"]})
    h.engine(_done(h.submitted()[-1].turn_id))
    assert caplog.records[-1].trace["workflow_name"] == "Realtime Session"


@pytest.mark.parametrize("dialect", list(Dialect))
def test_tracing_cannot_change_once_enabled(dialect: Dialect) -> None:
    h = Harness(dialect)
    h.send(type="session.update", session=_session(dialect, tracing="auto"))
    h.send(type="session.update", session=_session(dialect, tracing="auto"))  # the same value: fine
    assert not _errors(h)
    for value in ({"workflow_name": "other"}, None):
        h.send(type="session.update", event_id="t", session=_session(dialect, tracing=value))
        assert (_errors(h)[-1]["code"], _errors(h)[-1]["param"]) == ("cannot_update_tracing", "session.tracing")
    assert h.session.config.tracing == "auto"


# ---- usage -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dialect", list(Dialect))
def test_usage_counts_input_and_output_tokens_by_modality(dialect: Dialect) -> None:
    """`response.done.usage` splits input into text / audio / image (and the cached share the same way),
    output into text tokens and audio tokens (talker steps), as the openai `Usage` types define them."""
    h = Harness(dialect)
    h.send(type="response.create")
    turn_id = h.submitted()[-1].turn_id
    h.engine(TextDelta(turn_id, "Hi"))
    h.engine(AudioChunk(turn_id, np.zeros(4410, np.float32)))
    h.engine(TurnDone(turn_id, "Hi", FinishReason.STOP, 160, 90, 5, 4410, {}, prompt=PromptTokens(40, 100, 20),
                      cached=PromptTokens(30, 60, 0), talker_steps=7))
    usage = h.last("response.done")["response"]["usage"]
    assert (usage["input_tokens"], usage["output_tokens"], usage["total_tokens"]) == (160, 12, 172)
    details = usage["input_token_details"]
    assert (details["text_tokens"], details["audio_tokens"], details["image_tokens"]) == (40, 100, 20)
    assert details["cached_tokens"] == 90
    if dialect is GA:  # the beta SDK type has no cached_tokens_details
        assert details["cached_tokens_details"] == {"text_tokens": 30, "audio_tokens": 60, "image_tokens": 0}
    assert usage["output_token_details"] == {"text_tokens": 5, "audio_tokens": 7}


# ---- out-of-band responses ---------------------------------------------------------------------------


def _events_of(h: Harness, response_id: str, since: int) -> list[dict]:
    return [f for f in h.frames[since:] if f.get("response_id") == response_id
            or f.get("response", {}).get("id") == response_id]


@pytest.mark.parametrize("dialect", list(Dialect))
def test_out_of_band_response_runs_beside_a_spoken_reply(dialect: Dialect) -> None:
    """A `conversation: "none"` response starts while a spoken reply is generating; the two interleave,
    each event carries its own response id, both complete, and only the main reply enters the conversation."""
    h = Harness(dialect)
    h.send(type="response.create")
    main = h.submitted()[-1]
    h.engine(TextDelta(main.turn_id, "Hello "))
    mark = len(h.frames)
    h.send(type="response.create", response={"conversation": "none", "instructions": "Classify the topic.",
                                             "metadata": {"purpose": "topic"}, **_text_only(dialect)})
    assert not _errors(h, mark)
    oob = h.submitted()[-1]
    assert oob.turn_id != main.turn_id and oob.conversation_id != main.conversation_id
    assert oob.system == "Classify the topic."
    created = h.last("response.created")["response"]
    assert created["id"] == oob.turn_id and created["conversation_id"] is None
    h.engine(TextDelta(oob.turn_id, "weather"))
    h.engine(AudioChunk(main.turn_id, np.zeros(4410, np.float32)))
    h.engine(TextDelta(main.turn_id, "there."))
    h.engine(_done(oob.turn_id))
    h.engine(_done(main.turn_id))
    done = {f["response"]["id"]: f["response"] for f in h.frames if f["type"] == "response.done"}
    assert done[oob.turn_id]["status"] == done[main.turn_id]["status"] == "completed"
    assert done[oob.turn_id]["metadata"] == {"purpose": "topic"}
    text_type = "response.output_text.delta" if dialect is GA else "response.text.delta"
    oob_deltas = [f["delta"] for f in _events_of(h, oob.turn_id, mark) if f["type"] == text_type]
    assert oob_deltas == ["weather"]
    transcript = "response.output_audio_transcript.delta" if dialect is GA else "response.audio_transcript.delta"
    assert [f["delta"] for f in _events_of(h, main.turn_id, 0) if f["type"] == transcript] == ["Hello ", "there."]
    oob_item = done[oob.turn_id]["output"][0]["id"]
    assert oob_item not in h.session.conversation and done[main.turn_id]["output"][0]["id"] in h.session.conversation


def test_out_of_band_response_cancelled_by_id_leaves_the_main_reply() -> None:
    h = Harness()
    h.send(type="response.create")
    main = h.submitted()[-1]
    h.send(type="response.create", response={"conversation": "none"})
    oob = h.submitted()[-1]
    h.send(type="response.cancel", response_id=oob.turn_id)
    assert CancelTurn(oob.turn_id) in h.commands and CancelTurn(main.turn_id) not in h.commands
    assert h.last("response.done")["response"]["id"] == oob.turn_id
    assert h.last("response.done")["response"]["status"] == "cancelled"
    h.engine(_done(main.turn_id))
    assert h.last("response.done")["response"]["status"] == "completed"


def test_out_of_band_responses_are_bounded() -> None:
    h = Harness(settings=SessionSettings(max_out_of_band_responses=1))
    h.send(type="response.create", response={"conversation": "none"})
    h.send(type="response.create", event_id="x", response={"conversation": "none"})
    (error,) = _errors(h)
    assert (error["code"], error["param"], error["event_id"]) == (
        "too_many_out_of_band_responses", "response.conversation", "x")
    h.send(type="response.create")  # the default conversation is still free
    assert len(h.submitted()) == 2 and len(_errors(h)) == 1


def test_second_main_response_still_refused() -> None:
    h = Harness()
    h.send(type="response.create", response={"conversation": "none"})
    h.send(type="response.create")
    h.send(type="response.create")
    (error,) = _errors(h)
    assert error["code"] == "conversation_already_has_active_response"


def test_close_cancels_out_of_band_responses() -> None:
    h = Harness()
    h.send(type="response.create")
    h.send(type="response.create", response={"conversation": "none"})
    turn_ids = [r.turn_id for r in h.submitted()]
    actions = h.session.close()
    assert {a.turn_id for a in actions if isinstance(a, CancelTurn)} == set(turn_ids)


# ---- input_image detail ------------------------------------------------------------------------------


def _png(width: int, height: int) -> str:
    import base64
    import io

    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (width, height), (200, 30, 60)).save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def test_input_image_detail_low_sends_a_low_resolution_image() -> None:
    """`detail: "low"` hands the model at most 512 x 512 pixels; "high" / "auto" / absent keep the
    model's own resize (a 1600 x 1200 image stays above that). GA only: beta has no `input_image`
    (`invalid_value`, tested with the parser)."""
    from realtime_ming.session.content import LOW_DETAIL_MAX_PIXELS

    dialect = GA
    h = Harness(dialect)
    url = _png(1600, 1200)
    pixels = {}
    for detail in ("low", "high", "auto", None):
        part = {"type": "input_image", "image_url": url, **({"detail": detail} if detail else {})}
        h.send(type="response.create", response={"input": [
            {"type": "message", "role": "user", "content": [part]}], **_text_only(dialect)})
        request = h.submitted()[-1]
        image = request.history[-1].content[0].image
        pixels[detail] = image.shape[0] * image.shape[1]
        h.engine(_done(request.turn_id))
    assert not _errors(h)
    assert pixels["low"] <= LOW_DETAIL_MAX_PIXELS < pixels["high"] == pixels["auto"] == pixels[None]


def test_barge_in_cancels_the_main_response_only() -> None:
    """Speech during a spoken reply cancels that reply (`turn_detected`); an out-of-band response keeps
    running (it is not part of the conversation being interrupted) and completes."""
    from server_support import silence, tone
    from session_support import MODEL_HZ, vad_harness, vad_response

    h = vad_harness()
    main_id = vad_response(h)
    h.send(type="response.create", response={"conversation": "none", "output_modalities": ["text"]})
    oob_id = h.submitted()[-1].turn_id
    h.append(tone(0.9, MODEL_HZ))  # longer than barge_in_min_speech_ms: a real interruption
    assert CancelTurn(main_id) in h.commands and CancelTurn(oob_id) not in h.commands
    assert h.last("response.done")["response"]["id"] == main_id
    h.engine(TextDelta(oob_id, "topic"))
    h.engine(_done(oob_id))
    oob_done = h.last("response.done")["response"]
    assert (oob_done["id"], oob_done["status"]) == (oob_id, "completed")
    h.append(silence(1.0, MODEL_HZ))
    assert not _errors(h)
