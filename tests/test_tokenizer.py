"""Thinker tokenizer: tiny embedded tokenizers, chat template, streaming detokenizer, tokenizer lookup."""

from __future__ import annotations

import json
import shutil

import pytest

from realtime_ming.model.multimodal import AudioInput, ImageInput, MediaKind
from realtime_ming.model.tiny_tokenizer import (
    TINY_VOCAB_SIZE,
    build_tiny_talker_tokenizer,
    build_tiny_thinker_tokenizer,
    tiny_talker_special_ids,
    tiny_thinker_special_ids,
    tiny_thinker_tokenizer,
    tiny_tokenizer_path,
)
from realtime_ming.model.tokenizer import (
    HF_TOKENIZER_REPO,
    ChatMessage,
    IncrementalDecoder,
    TokenizerNotFoundError,
    resolve_tokenizer,
)

MULTIBYTE = "Grüße, 你好世界! 😀 naïve — ok"


@pytest.fixture(scope="module")
def tok():
    return tiny_thinker_tokenizer()


def test_tiny_thinker_special_ids_match_fixture(load_case):
    """Tiny thinker special ids equal the fixture checkpoint's tiny ids (real id − 156700)."""
    _, meta = load_case("thinker_text")
    ours = tiny_thinker_special_ids()
    assert {name: ours[name] for name in meta["special_ids_tiny"]} == meta["special_ids_tiny"]
    assert ours["<|role_end|>"] == 156895 - 156700


def test_tiny_talker_special_ids_match_fixture(load_case):
    """Every talker_loop template piece that starts with a special token starts with our tiny id."""
    _, meta = load_case("talker_loop")
    specials = tiny_talker_special_ids()
    checked = set()
    for piece in meta["template"]["pieces"]:
        for name, tid in specials.items():
            if piece["text"].startswith(name):
                assert piece["ids"][0] == tid, name
                checked.add(name)
    assert checked == set(specials) - {"<|endoftext|>"}


@pytest.mark.parametrize("kind,build", [("thinker", build_tiny_thinker_tokenizer), ("talker", build_tiny_talker_tokenizer)])
def test_tiny_tokenizer_shipped_equals_build(kind, build):
    """The shipped tokenizer.json is exactly what the builder produces (regenerate if this fails)."""
    shipped = json.loads(tiny_tokenizer_path(kind).read_text(encoding="utf-8"))
    assert shipped == json.loads(build().to_str())


@pytest.mark.parametrize("build,specials", [(build_tiny_thinker_tokenizer, tiny_thinker_special_ids),
                                            (build_tiny_talker_tokenizer, tiny_talker_special_ids)])
def test_tiny_tokenizer_round_trip(build, specials):
    """Bytes round-trip (multibyte included), specials are single ids, every id fits the 512 vocab."""
    t = build()
    ids = t.encode(MULTIBYTE, add_special_tokens=False).ids
    assert len(ids) == len(MULTIBYTE.encode("utf-8"))
    assert t.decode(ids) == MULTIBYTE
    for name, tid in specials().items():
        assert t.encode(name, add_special_tokens=False).ids == [tid]
    assert max(t.get_vocab().values()) < TINY_VOCAB_SIZE
    assert len(set(t.get_vocab().values())) == 256 + len(specials())


def test_incremental_decoder_never_splits_characters(tok):
    """Fed one id at a time, deltas join to the text, none contains U+FFFD, specials are skipped."""
    ids = tok.encode(MULTIBYTE)
    ids.insert(5, tok.eos_id)
    dec = tok.incremental_decoder()
    deltas = [dec.push(i) for i in ids] + [dec.flush()]
    assert "".join(deltas) == MULTIBYTE == dec.text
    assert not any("\ufffd" in d for d in deltas)
    assert deltas[ids.index(tok.encode("你")[0]):][:3] == ["", "", "你"]


def test_incremental_decoder_flushes_incomplete_character(tok):
    """A stream ending inside a character releases U+FFFD only at flush()."""
    dec = IncrementalDecoder(tok.tokenizer)
    first_two = tok.encode("你")[:2]
    assert [dec.push(i) for i in tok.encode("a") + first_two] == ["a", "", ""]
    assert dec.flush() == "\ufffd"


def test_chat_template_default_system(tok):
    """Default prompt: system sentence + 'detailed thinking off', HUMAN turn, ASSISTANT generation prompt."""
    prompt = tok.build_prompt([ChatMessage("user", "Hi 你好")])
    assert tok.decode(prompt.input_ids, skip_special_tokens=False) == (
        "<role>SYSTEM</role>你是一个友好的AI助手。\n\ndetailed thinking off<|role_end|>"
        "<role>HUMAN</role>Hi 你好<|role_end|><role>ASSISTANT</role>")
    assert prompt.input_ids.count(tok.eos_id) == 2


def test_chat_template_custom_system_multi_turn(tok):
    """A custom system replaces only the sentence; earlier assistant turns end with <|role_end|>."""
    msgs = [ChatMessage("user", "a"), ChatMessage("assistant", "b"), ChatMessage("user", "c")]
    prompt = tok.build_prompt(msgs, system="Be brief.", thinking=True, add_generation_prompt=False)
    assert tok.decode(prompt.input_ids, skip_special_tokens=False) == (
        "<role>SYSTEM</role>Be brief.\n\ndetailed thinking on<|role_end|><role>HUMAN</role>a<|role_end|>"
        "<role>ASSISTANT</role>b<|role_end|><role>HUMAN</role>c<|role_end|>")


def test_chat_template_media_placeholders(tok):
    """Image expands to <image> patches </image> + newline, audio to <audio> patches </audio>, spans recorded."""
    msg = ChatMessage("user", (ImageInput((1, 4, 6)), "What is this?", AudioInput(3)))
    prompt = tok.build_prompt([msg])
    text = tok.decode(prompt.input_ids, skip_special_tokens=False)
    assert ("<role>HUMAN</role><image>" + "<imagePatch>" * 6 + "</image>\nWhat is this?<audio>"
            + "<audioPatch>" * 3 + "</audio><|role_end|>") in text
    image, audio = prompt.spans
    assert (image.kind, image.length, image.grid_thw) == (MediaKind.IMAGE, 6, (1, 4, 6))
    assert prompt.input_ids[audio.start - 1] == tok.media.audio_start
    assert prompt.audio_placeholder_loc_lens == [(audio.start, 3)]


def test_user_text_special_spelling_stays_literal(tok):
    """'<role>' typed by a user encodes as text bytes, not as the control token."""
    ids = tok.build_prompt([ChatMessage("user", "<role>")]).input_ids
    assert ids.count(tok.token_id("<role>")) == 3  # SYSTEM, HUMAN, ASSISTANT headers only
    assert tok.encode("<role>") == list("<role>".encode())


def test_resolve_tokenizer_prefers_checkpoint_then_path(tmp_path):
    """tokenizer.json is found in the checkpoint folder, else at --tokenizer (file or folder)."""
    src = tiny_tokenizer_path("thinker")
    ckpt, other = tmp_path / "ckpt", tmp_path / "other"
    ckpt.mkdir()
    other.mkdir()
    shutil.copy(src, other / "tokenizer.json")
    assert resolve_tokenizer(ckpt, other).eos_id == 195
    assert resolve_tokenizer(ckpt, other / "tokenizer.json").eos_id == 195
    shutil.copy(src, ckpt / "tokenizer.json")
    assert resolve_tokenizer(ckpt).media.audio_patch == 468


def test_resolve_tokenizer_missing_says_what_to_download(tmp_path):
    """Without a tokenizer the error names the three files, the HF repo and the checkpoint folder."""
    with pytest.raises(TokenizerNotFoundError) as err:
        resolve_tokenizer(tmp_path, tmp_path / "nowhere")
    message = str(err.value)
    for part in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", HF_TOKENIZER_REPO,
                 str(tmp_path / "tokenizer.json"), str(tmp_path / "nowhere" / "tokenizer.json")):
        assert part in message


def test_standin_tokenizer_word_pieces_on_real_special_ids():
    """Dummy full-shape runs: specials keep the real ids, text round-trips, ~1.2 tokens per English word."""
    from realtime_ming.engine.models import _standin_tokenizers
    from realtime_ming.model.presets import preset_config
    from realtime_ming.model.standin_tokenizer import tokens_per_word

    ck = preset_config("ming-flash-omni-2.0")
    reply = "Sure. The weather today looks sunny, with a light breeze from the west and a high of twenty degrees."
    thinker, talker = _standin_tokenizers(ck, [reply])
    assert thinker.eos_id == ck.thinker.eos_token_id
    assert talker.token_to_id("<audioPatch>") == 151666 and talker.token_to_id("<|im_end|>") == 151645
    for text in (reply, "Zebras juggle quantum chromodynamics — 42 ünïcödé bytes!"):
        ids = thinker.encode(text)
        assert thinker.decode(ids) == text and max(ids) < ck.thinker.vocab_size
        assert talker.decode(talker.encode(text, add_special_tokens=False).ids) == text
    assert 1.0 <= tokens_per_word(talker, reply) < 1.5  # a byte-level tokenizer would give ~5
    assert len(thinker.encode(reply)) < 1.5 * len(reply.split())
