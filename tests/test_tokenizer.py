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
    tiny_tokenizers_for,
)
from realtime_ming.model.config import load_checkpoint_config
from realtime_ming.model.tokenizer import (
    HF_TOKENIZER_REPO,
    ChatMessage,
    IncrementalDecoder,
    ThinkerTokenizer,
    TokenizerMismatchError,
    TokenizerNotFoundError,
    check_talker_tokenizer,
    resolve_tokenizer,
)

MULTIBYTE = "Grüße, 你好世界! 😀 naïve — ok"


@pytest.fixture(scope="module")
def tok():
    return tiny_thinker_tokenizer()


def _case_talker_audio_ids(meta) -> dict[str, int]:
    """<audio> / <audioPatch> ids of the talker_loop case (no config holds them)."""
    return {p["text"]: p["ids"][0] for p in meta["template"]["pieces"] if p["text"] in ("<audio>", "<audioPatch>")}


def test_tiny_thinker_special_ids_match_fixture(load_case, fixture_root):
    """Thinker special ids placed by the fixture config's eos_token_id equal the case's tiny ids."""
    _, meta = load_case("thinker_text")
    cfg = load_checkpoint_config(fixture_root).thinker
    ours = tiny_thinker_special_ids(cfg.eos_token_id)
    assert {name: ours[name] for name in meta["special_ids_tiny"]} == meta["special_ids_tiny"]
    assert ours["<|role_end|>"] == cfg.eos_token_id and ours["<|endoftext|>"] == cfg.pad_token_id
    assert tiny_thinker_special_ids(cfg.eos_token_id + 7)["<imagePatch>"] == ours["<imagePatch>"] + 7


def test_tiny_talker_special_ids_match_fixture(load_case, fixture_root):
    """Every talker_loop template piece that starts with a special token starts with the id placed by the
    fixture's talker bos_token_id."""
    _, meta = load_case("talker_loop")
    llm = load_checkpoint_config(fixture_root).talker.llm
    specials = tiny_talker_special_ids(llm.bos_token_id, _case_talker_audio_ids(meta))
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
    from realtime_ming.engine.models import standin_tokenizers
    from realtime_ming.model.presets import preset_config
    from realtime_ming.model.standin_tokenizer import tokens_per_word

    ck = preset_config("ming-flash-omni-2.0")
    reply = "Sure. The weather today looks sunny, with a light breeze from the west and a high of twenty degrees."
    thinker, talker = standin_tokenizers(ck, [reply])
    assert thinker.eos_id == ck.thinker.eos_token_id
    assert talker.token_to_id("<audioPatch>") == 151666 and talker.token_to_id("<|im_end|>") == 151645
    for text in (reply, "Zebras juggle quantum chromodynamics — 42 ünïcödé bytes!"):
        ids = thinker.encode(text)
        assert thinker.decode(ids) == text and max(ids) < ck.thinker.vocab_size
        assert talker.decode(talker.encode(text, add_special_tokens=False).ids) == text
    assert 1.0 <= tokens_per_word(talker, reply) < 1.5  # a byte-level tokenizer would give ~5
    assert len(thinker.encode(reply)) < 1.5 * len(reply.split())


def test_fixture_tokenizers_pass_the_startup_check(load_case, fixture_root):
    """Tokenizers placed on the fixture config's ids pass both checks and encode the case's special ids."""
    ck = load_checkpoint_config(fixture_root)
    _, meta = load_case("talker_loop")
    thinker, talker = tiny_tokenizers_for(ck, _case_talker_audio_ids(meta))
    ThinkerTokenizer(thinker).check_config(ck.thinker)
    check_talker_tokenizer(talker, ck.talker.llm)
    _, text_meta = load_case("thinker_text")
    assert {n: thinker.token_to_id(n) for n in text_meta["special_ids_tiny"]} == text_meta["special_ids_tiny"]


def test_mismatched_tokenizer_is_one_clear_error(fixture_root):
    """A tokenizer whose special ids or vocab disagree with the config raises TokenizerMismatchError, one line
    naming each disagreeing field."""
    import dataclasses

    ck = load_checkpoint_config(fixture_root)
    shifted = dataclasses.replace(ck.thinker, eos_token_id=ck.thinker.eos_token_id + 1)
    thinker, talker = tiny_tokenizers_for(ck)
    with pytest.raises(TokenizerMismatchError) as err:
        ThinkerTokenizer(thinker).check_config(shifted)
    message = str(err.value)
    assert "\n" not in message and "eos_token_id" in message and "pad_token_id" not in message
    assert isinstance(err.value, ValueError)
    small = dataclasses.replace(ck.thinker, vocab_size=300)
    with pytest.raises(TokenizerMismatchError, match="vocab_size=300"):
        ThinkerTokenizer(thinker).check_config(small)
    wrong_bos = dataclasses.replace(ck.talker.llm, bos_token_id=ck.talker.llm.bos_token_id + 20)
    with pytest.raises(TokenizerMismatchError, match="bos_token_id"):
        check_talker_tokenizer(talker, wrong_bos)


def test_engine_start_refuses_another_checkpoints_tokenizer(fixture_root, tmp_path):
    """ModelBundle.load with --tokenizer of other special ids fails before loading weights, naming the fields."""
    import dataclasses

    from realtime_ming.engine.config import EngineConfig
    from realtime_ming.engine.models import ModelBundle

    ck = load_checkpoint_config(fixture_root)
    other = dataclasses.replace(ck, ming=dataclasses.replace(ck.ming, llm_config=dataclasses.replace(
        ck.thinker, eos_token_id=ck.thinker.eos_token_id + 3)))
    thinker, talker = tiny_tokenizers_for(other)
    thinker.save(str(tmp_path / "thinker.json"))
    talker.save(str(tmp_path / "talker.json"))
    cfg = EngineConfig(model_path=str(fixture_root), tokenizer_path=str(tmp_path / "thinker.json"),
                       talker_tokenizer_path=str(tmp_path / "talker.json"))
    with pytest.raises(TokenizerMismatchError, match="thinker tokenizer .*thinker.json.*eos_token_id"):
        ModelBundle.load(cfg)
