"""Strict keys: every client event key is one the openai package's types define (or a documented extension)."""

from __future__ import annotations

import json

import pytest
from client_keys_support import ASSET, generate

from realtime_ming.protocol import Dialect, ErrorCode, ProtocolError, SessionConfig, parse
from realtime_ming.protocol.session import apply_update
from realtime_ming.protocol.audio_input import NoiseReduction, NoiseReductionType

GA, BETA = Dialect.GA, Dialect.BETA
_MESSAGE = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}


def test_committed_key_tree_matches_the_installed_openai_types() -> None:
    """The committed key tree is what tests/client_keys_support.py derives from the installed openai package."""
    committed = json.loads(ASSET.read_text())
    assert committed == generate(), "regenerate it: python3 tests/client_keys_support.py"


@pytest.mark.parametrize(("dialect", "event", "param"), [
    (GA, {"type": "response.create", "response": {"foo": 1}}, "response.foo"),
    (GA, {"type": "response.create", "response": {"instructions": "x", "audio": {"output": {"voise": "a"}}}},
     "response.audio.output.voise"),
    (GA, {"type": "response.create", "foo": 1}, "foo"),
    (GA, {"type": "input_audio_buffer.commit", "flush": True}, "flush"),
    (GA, {"type": "conversation.item.create", "item": {**_MESSAGE, "rol": "user"}}, "item.rol"),
    (GA, {"type": "conversation.item.create", "item": {**_MESSAGE, "content": [
        {"type": "input_text", "text": "hi", "txt": "x"}]}}, "item.content[0].txt"),
    (GA, {"type": "session.update", "session": {"type": "realtime", "temperature": 0.7}}, "session.temperature"),
    (GA, {"type": "session.update", "session": {"type": "realtime", "input_audio_format": "pcm16"}},
     "session.input_audio_format"),
    (BETA, {"type": "response.create", "response": {"output_modalities": ["text"]}}, "response.output_modalities"),
    (BETA, {"type": "session.update", "session": {"audio": {}}}, "session.audio"),
])
def test_unknown_key_in_any_client_event_is_unknown_parameter(dialect: Dialect, event: dict, param: str) -> None:
    """An unknown key anywhere in a client event gives unknown_parameter with its path and the client event_id."""
    error = parse(json.dumps({**event, "event_id": "e1"}), dialect)
    assert isinstance(error, ProtocolError)
    assert (error.code, error.param, error.event_id) == (ErrorCode.UNKNOWN_PARAMETER, param, "e1")


@pytest.mark.parametrize(("dialect", "event"), [
    (GA, {"type": "response.create", "response": {"temperature": 0.7, "realtime_ming": {"speed": 1.2}}}),
    (GA, {"type": "response.create", "response": {"input": [{"type": "item_reference", "id": "item_1"}]}}),
    (GA, {"type": "conversation.item.create", "item": {"type": "message", "role": "user", "content": [
        {"type": "input_video", "frames": [{"image_url": "data:image/png;base64,iVBORw0KGgo=", "timestamp_s": 0}]}]}}),
    (GA, {"type": "session.update", "session": {"type": "realtime", "id": "sess_1", "object": "realtime.session",
                                                "realtime_ming": {"timing_events": True}}}),
    (GA, {"type": "session.update", "session": {"type": "realtime", "tracing": {"metadata": {"any": {"k": 1}}}}}),
    (BETA, {"type": "session.update", "session": {"temperature": 0.7, "input_audio_format": "pcm16"}}),
])
def test_documented_keys_and_extensions_are_accepted(dialect: Dialect, event: dict) -> None:
    """openai's keys, this server's extensions, free-form objects and echoed read-only keys all parse."""
    assert not isinstance(parse(json.dumps(event), dialect), ProtocolError)


def test_noise_reduction_strength_defaults_to_one_and_is_kept_when_left_out() -> None:
    """strength defaults to 1 when noise reduction is first enabled; an update without it keeps the current one."""
    on = apply_update(SessionConfig(), {"audio": {"input": {"noise_reduction": {"type": "near_field"}}}}, GA)
    assert on.noise_reduction == NoiseReduction(NoiseReductionType.NEAR_FIELD, 1.0)
    soft = apply_update(on, {"audio": {"input": {"noise_reduction": {"type": "near_field", "strength": 0.0}}}}, GA)
    far = apply_update(soft, {"audio": {"input": {"noise_reduction": {"type": "far_field"}}}}, GA)
    assert far.noise_reduction == NoiseReduction(NoiseReductionType.FAR_FIELD, 0.0)
