"""Session config: partial `session.update` semantics, rejection without change, GA/beta rendering
validated by the openai SDK session types, and our extensions (PCM rates, timing opt-in)."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

import pytest
from openai.types.beta.realtime.session import Session as BetaSession
from openai.types.realtime import RealtimeSessionCreateRequest
from pydantic import TypeAdapter, ValidationError

from realtime_ming.protocol import (
    AudioEncoding,
    AudioFormat,
    Dialect,
    ErrorCode,
    FunctionChoice,
    FunctionTool,
    InputTranscription,
    Modality,
    ProtocolError,
    SemanticVad,
    ServerVad,
    SessionConfig,
    apply_update,
    parse_session_update,
    session_to_wire,
)
from realtime_ming.protocol.session import _SESSION_FIELDS

GA_SESSION = TypeAdapter(RealtimeSessionCreateRequest)
BETA_SESSION = TypeAdapter(BetaSession)
TOOL_WIRE = {"type": "function", "name": "lookup", "description": "Look up", "parameters": {"type": "object"}}


def _validate(config: SessionConfig, dialect: Dialect) -> dict[str, Any]:
    wire = session_to_wire(config, dialect)
    (GA_SESSION if dialect is Dialect.GA else BETA_SESSION).validate_python(wire, strict=True)
    return wire


def test_session_fields_all_have_wire_paths() -> None:
    """Every SessionConfig attribute except id and the session type (the GA `type` header) is mapped by the
    GA or the beta field table."""
    mapped = {f.name for table in _SESSION_FIELDS.values() for f in table}
    assert {f.name for f in fields(SessionConfig)} - {"id", "session_type"} == mapped


def test_session_defaults_render_valid_ga_and_beta() -> None:
    """The default session renders as an SDK-valid GA realtime session and beta session."""
    config = SessionConfig()
    ga = _validate(config, Dialect.GA)
    beta = _validate(config, Dialect.BETA)
    assert ga["type"] == "realtime" and ga["object"] == "realtime.session" and ga["id"] == config.id
    assert ga["output_modalities"] == ["audio"]
    assert ga["audio"]["input"]["format"] == {"type": "audio/pcm", "rate": 24000}
    assert ga["audio"]["input"]["turn_detection"] == {
        "type": "server_vad",
        "threshold": 0.5,
        "prefix_padding_ms": 300,
        "silence_duration_ms": 500,
        "create_response": True,
        "interrupt_response": True,
        "idle_timeout_ms": None,
    }
    assert ga["realtime_ming"] == {"timing_events": False, "speech": None, "output_lead_ms": 150,
                                   "output_audio_buffer": False}
    assert beta["modalities"] == ["text", "audio"]
    assert beta["input_audio_format"] == beta["output_audio_format"] == "pcm16"
    assert "idle_timeout_ms" not in beta["turn_detection"]
    assert "model" not in beta and beta["max_response_output_tokens"] == "inf" and beta["temperature"] == 0.8


def test_session_rich_config_renders_valid() -> None:
    """A non-default config (text-only, G.711, semantic VAD, tools, forced function) validates in both shapes."""
    config = SessionConfig(
        output_modalities=(Modality.TEXT,),
        input_format=AudioFormat.pcmu(),
        output_format=AudioFormat.pcma(),
        turn_detection=SemanticVad(),
        transcription=InputTranscription(model="whisper-1", language="de"),
        tools=(FunctionTool("lookup", "Look up", {"type": "object"}),),
        tool_choice=FunctionChoice("lookup"),
        max_output_tokens=300,
    )
    ga, beta = _validate(config, Dialect.GA), _validate(config, Dialect.BETA)
    assert ga["tool_choice"] == {"type": "function", "name": "lookup"} and beta["tool_choice"] == "lookup"
    assert (
        ga["audio"]["output"]["format"] == {"type": "audio/pcma"}
        and beta["output_audio_format"] == "g711_alaw"
    )
    assert ga["output_modalities"] == beta["modalities"] == ["text"]
    assert beta["input_audio_transcription"] == {"model": "whisper-1", "language": "de"}


def test_apply_update_changes_only_present_fields() -> None:
    """A partial update changes the fields sent and keeps every other field."""
    before = SessionConfig(instructions="old", tools=(FunctionTool("lookup"),))
    after = apply_update(before, {"type": "realtime", "audio": {"output": {"voice": "ash"}}}, Dialect.GA)
    assert after.voice == "ash"
    assert after == SessionConfig(**{**_as_dict(before), "voice": "ash"})


def _as_dict(config: SessionConfig) -> dict[str, Any]:
    return {f.name: getattr(config, f.name) for f in fields(config)}


@pytest.mark.parametrize("dialect", list(Dialect))
def test_apply_update_clearing_values(dialect: Dialect) -> None:
    """ "" clears instructions, [] clears tools, null clears turn detection (both dialects)."""
    before = SessionConfig(instructions="old", tools=(FunctionTool("lookup"),))
    td_key = (
        {"audio": {"input": {"turn_detection": None}}} if dialect is Dialect.GA else {"turn_detection": None}
    )
    after = apply_update(before, {"instructions": "", "tools": [], **td_key}, dialect)
    assert (after.instructions, after.tools, after.turn_detection) == ("", (), None)
    assert after.voice == before.voice and after.input_format == before.input_format


def test_apply_update_turn_detection_is_replaced_whole() -> None:
    """A turn_detection object replaces the old one; omitted sub-fields take their defaults."""
    before = SessionConfig(turn_detection=ServerVad(threshold=0.9, silence_duration_ms=800))
    update = {"audio": {"input": {"turn_detection": {"type": "server_vad", "silence_duration_ms": 200}}}}
    after = apply_update(before, update, Dialect.GA)
    assert after.turn_detection == ServerVad(silence_duration_ms=200)


def test_apply_update_rejects_without_change() -> None:
    """An update with valid fields and one bad field raises and leaves the live config as it was."""
    before = SessionConfig()
    snapshot = _as_dict(before)
    update = {
        "instructions": "new",
        "audio": {"input": {"format": {"type": "audio/pcm", "rate": 11025}}, "output": {"voice": "ash"}},
    }
    with pytest.raises(ProtocolError) as caught:
        apply_update(before, update, Dialect.GA)
    assert caught.value.code is ErrorCode.UNSUPPORTED_SAMPLE_RATE
    assert caught.value.param == "session.audio.input.format.rate"
    assert _as_dict(before) == snapshot


def test_apply_update_unknown_voice_uses_catalogue() -> None:
    """With a voice catalogue, an unknown voice is rejected with the dialect's param path."""
    voices = {"DB30", "lg"}
    for dialect, update, param in (
        (Dialect.GA, {"audio": {"output": {"voice": "alloy"}}}, "session.audio.output.voice"),
        (Dialect.BETA, {"voice": "alloy"}, "session.voice"),
    ):
        with pytest.raises(ProtocolError) as caught:
            apply_update(SessionConfig(), update, dialect, voices=voices)
        assert (caught.value.code, caught.value.param) == (ErrorCode.UNKNOWN_VOICE, param)
        assert caught.value.message == "Unknown voice 'alloy'; available voices: DB30, lg."
    assert apply_update(SessionConfig(), {"voice": "lg"}, Dialect.BETA, voices=voices).voice == "lg"


def test_apply_update_voice_object_and_null_instructions() -> None:
    """A GA custom voice object {"id"} sets the voice; null instructions clear them."""
    after = apply_update(
        SessionConfig(instructions="x"),
        {"instructions": None, "audio": {"output": {"voice": {"id": "lg"}}}},
        Dialect.GA,
    )
    assert (after.voice, after.instructions) == ("lg", "")


@pytest.mark.parametrize("rate", [16000, 44100])
def test_apply_update_accepts_extension_pcm_rates(rate: int) -> None:
    """GA audio/pcm at 16 kHz and 44.1 kHz is accepted (our extension) and echoed, though the SDK allows only 24 kHz."""
    update = {
        "audio": {
            "input": {"format": {"type": "audio/pcm", "rate": rate}},
            "output": {"format": {"rate": rate}},
        }
    }
    after = apply_update(SessionConfig(), update, Dialect.GA)
    assert after.input_format == after.output_format == AudioFormat(AudioEncoding.PCM, rate)
    wire = session_to_wire(after, Dialect.GA)
    assert wire["audio"]["output"]["format"] == {"type": "audio/pcm", "rate": rate}
    with pytest.raises(ValidationError):
        GA_SESSION.validate_python(wire)
    with pytest.raises(ValueError, match="beta dialect cannot express"):
        session_to_wire(after, Dialect.BETA)


def test_apply_update_beta_formats_map_to_rates() -> None:
    """Beta pcm16 is 24 kHz PCM and g711_ulaw / g711_alaw are 8 kHz G.711."""
    after = apply_update(
        SessionConfig(), {"input_audio_format": "g711_ulaw", "output_audio_format": "pcm16"}, Dialect.BETA
    )
    assert after.input_format == AudioFormat(AudioEncoding.PCMU, 8000)
    assert after.output_format == AudioFormat(AudioEncoding.PCM, 24000)


@pytest.mark.parametrize("dialect", list(Dialect))
def test_apply_update_timing_events_opt_in(dialect: Dialect) -> None:
    """realtime_ming.timing_events opts in (both dialects) and is echoed in the rendered session."""
    assert SessionConfig().timing_events is False
    after = apply_update(SessionConfig(), {"realtime_ming": {"timing_events": True}}, dialect)
    assert after.timing_events is True
    assert session_to_wire(after, dialect)["realtime_ming"] == {
        "timing_events": True, "speech": None, "output_lead_ms": 150, "output_audio_buffer": False}
    assert apply_update(after, {"instructions": "x"}, dialect).timing_events is True


@pytest.mark.parametrize("dialect", list(Dialect))
def test_apply_update_output_lead_and_playout_events(dialect: Dialect) -> None:
    """realtime_ming.output_lead_ms takes an integer in [40, 60000] ms or null (unpaced); output_audio_buffer a
    bool; both echo in the rendered session; anything else is refused naming the field, nothing changed."""
    after = apply_update(SessionConfig(), {"realtime_ming": {"output_lead_ms": 300, "output_audio_buffer": True}},
                         dialect)
    assert (after.output_lead_ms, after.output_audio_buffer) == (300, True)
    assert session_to_wire(after, dialect)["realtime_ming"]["output_lead_ms"] == 300
    assert apply_update(after, {"realtime_ming": {"output_lead_ms": None}}, dialect).output_lead_ms is None
    for bad in (39, 60_001, "200", True, 200.5):
        with pytest.raises(ProtocolError) as err:
            apply_update(after, {"realtime_ming": {"output_lead_ms": bad}}, dialect)
        assert err.value.param == "session.realtime_ming.output_lead_ms"
    with pytest.raises(ProtocolError) as err:
        apply_update(after, {"realtime_ming": {"output_audio_buffer": "yes"}}, dialect)
    assert err.value.param == "session.realtime_ming.output_audio_buffer"


def test_apply_update_semantic_vad_accepted() -> None:
    """semantic_vad (openai-agents' default) is accepted with its eagerness and flags."""
    update = {"audio": {"input": {"turn_detection": {"type": "semantic_vad", "interrupt_response": False}}}}
    after = apply_update(SessionConfig(), update, Dialect.GA)
    assert after.turn_detection == SemanticVad(interrupt_response=False)


def test_apply_update_ignores_echoed_read_only_keys() -> None:
    """The session object's read-only keys (id, object, expires_at) are ignored; `reasoning: null` is its
    empty value (a set one is refused, test_protocol_support.py)."""
    update = {"id": "sess_x", "object": "realtime.session", "expires_at": 0, "reasoning": None, "instructions": "hi"}
    after = apply_update(SessionConfig(), update, Dialect.GA)
    assert after.instructions == "hi" and after.id != "sess_x"


@pytest.mark.parametrize(("dialect", "update", "param"), [
    (Dialect.GA, {"instuctions": "hi", "instructions": "x"}, "session.instuctions"),
    (Dialect.GA, {"audio": {"output": {"voise": "ash"}}, "instructions": "x"}, "session.audio.output.voise"),
    (Dialect.GA, {"foo": 1, "instructions": "x"}, "session.foo"),
    (Dialect.GA, {"tools": [{"type": "function", "name": "f", "parameter": {}}]}, "session.tools[0].parameter"),
    (Dialect.GA, {"audio": {"input": {"turn_detection": {"type": "server_vad", "treshold": 0.2}}}},
     "session.audio.input.turn_detection.treshold"),
    (Dialect.GA, {"audio": {"input": {"noise_reduction": {"type": "near_field", "strenght": 1}}}},
     "session.audio.input.noise_reduction.strenght"),
    (Dialect.GA, {"realtime_ming": {"timing_event": True}}, "session.realtime_ming.timing_event"),
    (Dialect.BETA, {"voice": "ash", "input_audio_fromat": "pcm16"}, "session.input_audio_fromat"),
])
def test_apply_update_unknown_key_is_refused_with_its_path(dialect: Dialect, update: dict, param: str) -> None:
    """A key the openai types of the dialect do not define is `unknown_parameter` naming its path, and
    nothing of the update is applied."""
    with pytest.raises(ProtocolError) as caught:
        apply_update(SessionConfig(), update, dialect)
    assert (caught.value.code, caught.value.param) == (ErrorCode.UNKNOWN_PARAMETER, param)


def test_unknown_key_error_suggests_the_close_known_key() -> None:
    """A typo's message names the key it is close to."""
    with pytest.raises(ProtocolError) as caught:
        apply_update(SessionConfig(), {"instuctions": "hi"}, Dialect.GA)
    assert caught.value.message == (
        "Unknown parameter: 'session.instuctions' (did you mean 'instructions'?). Nothing of the event was applied.")


@pytest.mark.parametrize("dialect", list(Dialect))
def test_session_wire_round_trips_through_update(dialect: Dialect) -> None:
    """Feeding a rendered session back as an update reproduces the same config."""
    config = SessionConfig(
        instructions="Be brief.",
        turn_detection=ServerVad(threshold=0.7, create_response=False),
        tools=(FunctionTool("lookup", "Look up", {"type": "object"}),),
        output_format=AudioFormat.pcmu(),
        timing_events=True,
    )
    assert apply_update(SessionConfig(id=config.id), session_to_wire(config, dialect), dialect) == config


def test_session_patch_to_wire_only_contains_changes() -> None:
    """A parsed patch re-encodes to exactly the keys the client sent (plus GA type)."""
    patch = parse_session_update({"tools": [TOOL_WIRE], "audio": {"output": {"speed": 1.2}}}, Dialect.GA)
    assert patch.to_wire(Dialect.GA) == {
        "type": "realtime",
        "tools": [TOOL_WIRE],
        "audio": {"output": {"speed": 1.2}},
    }
