"""Speech style: `audio.output.speed` and `realtime_ming.speech` reach the talker prompt as the reference builds it.

Reference (inclusionAI/Ming commit 3954fcb880ff5e61ff128bcf7f1ec344d46a6fe3, "release Ming-flash-omni 2.0"):
* `test_talker.py`: `BASE_CAPTION_TEMPLATE` (one `audio_sequence` entry: 序号 1, 说话人 "speaker_1", 方言, 风格,
  语速, 基频, 音量, 情感, BGM {Genre, Mood, Instrument, Theme, ENV, SNR}, IP; all null), `create_instruction`
  (the user's keys overwrite the template's values, order kept) and `json.dumps(instruction, ensure_ascii=False)`;
  its examples: {"情感": "高兴"}, {"语速": "快速", "基频": "中", "音量": "中"}, {"方言": "广粤话"}.
* `modeling_bailing_talker.py` `BailingTalker2.omni_audio_generation_func`: `instruction_prompt =
  encode(instruction) + encode('<|im_end|>')`, placed after `encode("<|im_start|>assistant\\n")` and before
  `encode("<audio>")` + the prompt-audio patches.
"""

from __future__ import annotations

import dataclasses

import pytest
from session_support import Harness, last_error
from talker_support import _recorded_encoder, case_special_ids, case_speak_text

from realtime_ming.model.talker import build_talker_prompt
from realtime_ming.model.talker_caption import TalkerCaption
from realtime_ming.protocol import Dialect

# json.dumps(create_instruction({"情感": "高兴"}), ensure_ascii=False), written out from the reference template
HAPPY = ('{"audio_sequence": [{"序号": 1, "说话人": "speaker_1", "方言": null, "风格": null, "语速": null, '
         '"基频": null, "音量": null, "情感": "高兴", "BGM": {"Genre": null, "Mood": null, "Instrument": null, '
         '"Theme": null, "ENV": null, "SNR": null}, "IP": null}]}')
BASIC = ('{"audio_sequence": [{"序号": 1, "说话人": "speaker_1", "方言": null, "风格": null, "语速": "快速", '
         '"基频": "中", "音量": "中", "情感": null, "BGM": {"Genre": null, "Mood": null, "Instrument": null, '
         '"Theme": null, "ENV": null, "SNR": null}, "IP": null}]}')


def test_caption_text_is_the_reference_instruction():
    assert TalkerCaption(emotion="高兴").instruction() == HAPPY
    assert TalkerCaption(rate="快速", pitch="中", volume="中").instruction() == BASIC
    assert TalkerCaption(dialect="广粤话").instruction() == HAPPY.replace('"方言": null', '"方言": "广粤话"').replace(
        '"情感": "高兴"', '"情感": null')
    assert TalkerCaption().instruction() is None  # no instruction: the reference prompt has no caption part


@pytest.fixture(scope="module")
def case(load_case):
    return load_case("talker_loop")


def _char_encoder(meta):
    """The fixture's recorded pieces, `<|im_end|>` as its special id, any other text one id per character
    (the caption is not among the recorded pieces)."""
    recorded = _recorded_encoder(meta)
    im_end = case_special_ids(meta).im_end

    def encode(text):
        if text == "<|im_end|>":
            return [im_end]
        try:
            return recorded(text)
        except KeyError:
            return [5000 + ord(c) for c in text]
    return encode


def test_captioned_prompt_is_token_exact_against_the_reference_layout(case):
    """The fixture's prompt (built by the official omni_audio_generation_func) with the caption inserted where the
    reference puts `instruction_prompt`: after `<|im_start|>assistant\\n`, before `<audio>` and the patches."""
    tensors, meta = case
    encode = _char_encoder(meta)
    special = case_special_ids(meta)
    voice = meta["voice"]
    kwargs = dict(num_speakers=1, prompt_text=voice["prompt_text"],
                  prompt_patches=tensors["prompt_wav_emb"].shape[1])
    plain = build_talker_prompt(encode, special, case_speak_text(meta), **kwargs)
    captioned = build_talker_prompt(encode, special, case_speak_text(meta), caption=BASIC, **kwargs)
    recorded = tensors["input_ids"][0].tolist()
    assert list(plain.input_ids) == recorded
    at = recorded.index(special.audio)
    instruction = encode(BASIC) + [special.im_end]
    assert list(captioned.input_ids) == recorded[:at] + instruction + recorded[at:]
    assert captioned.speaker_slots == plain.speaker_slots
    assert captioned.audio_slots == tuple(s + len(instruction) for s in plain.audio_slots)


# ---- the wire: session and response -----------------------------------------------------------------------
def _captions(h: Harness) -> list:
    return [r.caption for r in h.submitted()]


def test_session_speed_and_style_reach_the_turn_request():
    h = Harness()
    h.send(type="session.update", session={"type": "realtime", "audio": {"output": {"speed": 1.4}},
                                           "realtime_ming": {"speech": {"pitch": "medium", "volume": "中"}}})
    updated = h.last("session.updated")["session"]
    assert updated["audio"]["output"]["speed"] == 1.4
    assert updated["realtime_ming"]["speech"] == {"pitch": "medium", "volume": "中"}
    h.send(type="response.create")
    assert _captions(h) == [BASIC]


def test_defaults_give_no_caption_and_response_overrides_apply_to_that_response_only():
    h = Harness()
    h.send(type="response.create")
    h.finish_turn(h.submitted()[-1].turn_id)
    h.send(type="response.create", response={"realtime_ming": {"speech": {"emotion": "happy"}}})
    h.finish_turn(h.submitted()[-1].turn_id)
    h.send(type="response.create", response={"realtime_ming": {"speed": 0.5}})
    h.finish_turn(h.submitted()[-1].turn_id)
    h.send(type="response.create")
    slow = TalkerCaption(rate="慢速").instruction()
    assert _captions(h) == [None, HAPPY, slow, None]


def test_null_clears_the_session_style_and_speed_one_means_unset():
    h = Harness(Dialect.BETA)
    h.send(type="session.update", session={"speed": 0.8, "realtime_ming": {"speech": {"dialect": "cantonese"}}})
    h.send(type="session.update", session={"speed": 1.0, "realtime_ming": {"speech": None}})
    assert h.last("session.updated")["session"]["realtime_ming"]["speech"] is None
    h.send(type="response.create")
    assert _captions(h) == [None]


def test_text_only_responses_carry_no_caption():
    h = Harness()
    h.send(type="session.update", session={"type": "realtime", "output_modalities": ["text"],
                                           "realtime_ming": {"speech": {"emotion": "sad"}}})
    h.send(type="response.create")
    assert _captions(h) == [None]


@pytest.mark.parametrize(("speech", "param"), [
    ({"emotion": "ecstatic"}, "session.realtime_ming.speech.emotion"),
    ({"pitch": "very high"}, "session.realtime_ming.speech.pitch"),
    ({"volume": "大"}, "session.realtime_ming.speech.volume"),
    ({"dialect": 5}, "session.realtime_ming.speech.dialect"),
    ({"style": ""}, "session.realtime_ming.speech.style"),
    ({"style": "慢" * 301}, "session.realtime_ming.speech.style"),
    ({"emotion": "非常非常非常非常非常非常非常开心的"}, "session.realtime_ming.speech.emotion"),
    ({"timbre": "warm"}, "session.realtime_ming.speech.timbre"),
])
def test_invalid_style_is_a_specific_error_and_changes_nothing(speech, param):
    h = Harness()
    h.send(type="session.update", session={"type": "realtime", "realtime_ming": {"speech": {"emotion": "happy"}}})
    h.send(type="session.update", session={"type": "realtime", "audio": {"output": {"speed": 1.2}},
                                           "realtime_ming": {"speech": speech}}, event_id="e1")
    err = last_error(h)
    assert (err["code"], err["param"], err["event_id"]) == ("invalid_speech_style", param, "e1")
    h.send(type="response.create")
    assert _captions(h) == [HAPPY]  # neither the style nor the speed of the refused update applied


def test_invalid_response_style_fails_that_create_only():
    h = Harness()
    h.send(type="response.create", response={"realtime_ming": {"speech": {"volume": "loud"}}}, event_id="r1")
    err = last_error(h)
    assert (err["code"], err["param"]) == ("invalid_speech_style", "response.realtime_ming.speech.volume")
    h.send(type="response.create", response={"realtime_ming": {"speed": 2.0}}, event_id="r2")
    assert last_error(h)["param"] == "response.realtime_ming.speed"
    assert h.submitted() == []
    h.send(type="response.create")
    assert _captions(h) == [None]


def test_chinese_labels_pass_through_verbatim():
    h = Harness()
    style = "性别: 男性嗓音.\n\n语速: 整体语速偏快，结尾趋缓."
    h.send(type="session.update", session={"type": "realtime", "realtime_ming": {
        "speech": {"emotion": "惊喜", "dialect": "四川话", "style": style}}})
    h.send(type="response.create")
    want = TalkerCaption(emotion="惊喜", dialect="四川话", style=style).instruction()
    assert _captions(h) == [want]


def test_runner_puts_the_caption_into_every_job_prompt(monkeypatch, fixture_root):
    """The engine's talker runner builds each job's prompt with the turn's caption (and normalised Chinese text)."""
    from engine_support import _config

    from realtime_ming.engine import talker_runner as tr
    from realtime_ming.engine.hooks import EngineHooks
    from realtime_ming.engine.models import ModelBundle

    calls = []
    real = tr.build_talker_prompt

    def recording(encode, special, text, **kw):
        calls.append((text, kw.get("caption")))
        return real(encode, special, text, **kw)

    monkeypatch.setattr(tr, "build_talker_prompt", recording)
    cfg = _config(fixture_root)
    bundle = ModelBundle.load(cfg, hooks=EngineHooks(steps_per_word=1))
    talker_cfg = dataclasses.replace(cfg.talker, max_prompt_len=1024)  # the tiny tokenizer is verbose
    runner = tr.TalkerRunner(bundle, dataclasses.replace(cfg, talker=talker_cfg))
    runner.enqueue("t", 0, "气温25℃，下午3:30出发。", None, seed=1, caption=HAPPY)
    while runner.has_work():
        assert all(out.error is None for out in runner.step())
    assert calls and all(caption == HAPPY for _, caption in calls)
    assert "".join(text for text, _ in calls) == "气温二十五摄氏度，下午三点三十分出发。"
