"""Embedded byte-level tokenizers for the tiny CPU default (no downloads): thinker and talker.

Each is a `tokenizers` byte-level BPE without merges (one token per UTF-8 byte) plus the model's
special tokens as added tokens, all within a 512-id vocab. Thinker specials sit at the real Ming ids
minus 156700 and talker specials at the fixture's tiny Qwen2 ids (fixtures README "Tiny token ids"),
so the fixture checkpoint's config ids match; the 256 bytes fill the free ids from 0 upwards.
Regenerate the shipped files with `python -m realtime_ming.model.tiny_tokenizer`.

A tiny checkpoint with other ids (another fixture set) gets its own pair from `tiny_tokenizers_for`:
the thinker offset follows from the config's `eos_token_id` (`<|role_end|>`), the talker's from its
LM config's `bos_token_id` (`<|endoftext|>`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Mapping

from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from .tokenizer import ASSETS_DIR, MING_TOKENIZER_DIR, ThinkerTokenizer

__all__ = [
    "TINY_VOCAB_SIZE",
    "TINY_TOKENIZER_DIR",
    "tiny_thinker_special_ids",
    "tiny_talker_special_ids",
    "build_tiny_tokenizer",
    "build_tiny_thinker_tokenizer",
    "build_tiny_talker_tokenizer",
    "tiny_tokenizers_for",
    "tiny_tokenizer_path",
    "tiny_thinker_tokenizer",
    "write_tiny_tokenizers",
]

TINY_VOCAB_SIZE = 512
TINY_TOKENIZER_DIR = ASSETS_DIR / "tiny_tokenizer"  # thinker/tokenizer.json, talker/tokenizer.json
_THINKER_EOS = "<|role_end|>"
_TINY_THINKER_EOS_ID = 195  # tiny thinker id = real id - 156700 (fixtures README)
# standard Qwen2 ids of the talker's special tokens; the tiny ones are these minus 151500
_QWEN2_SPECIALS = {"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645,
                   "<|vision_start|>": 151652, "<|vision_end|>": 151653, "<|vision_pad|>": 151654}
_TINY_TALKER_BOS_ID = 143  # <|endoftext|>
_TINY_TALKER_AUDIO_IDS = {"<audio>": 250, "<audioPatch>": 251}


def _real_thinker_special_ids() -> dict[str, int]:
    config = json.loads((MING_TOKENIZER_DIR / "tokenizer_config.json").read_text(encoding="utf-8"))
    return {tok["content"]: int(i) for i, tok in config["added_tokens_decoder"].items()
            if not tok["content"].startswith("<|reserved_token_")}


def tiny_thinker_special_ids(eos_token_id: int = _TINY_THINKER_EOS_ID) -> dict[str, int]:
    """Every named (non-reserved) Ming special token -> its id shifted so that <|role_end|> gets
    `eos_token_id` (a checkpoint config's; the default tiny set: real id − 156700, <|role_end|> 195)."""
    real = _real_thinker_special_ids()
    shift = real[_THINKER_EOS] - eos_token_id
    return {name: i - shift for name, i in real.items()}


def tiny_talker_special_ids(bos_token_id: int = _TINY_TALKER_BOS_ID,
                            audio_ids: Mapping[str, int] | None = None) -> dict[str, int]:
    """Talker (Qwen2) special tokens -> tiny id: standard Qwen2 ids shifted so that <|endoftext|> gets
    `bos_token_id` (default 143: Qwen2 − 151500), and <audio> / <audioPatch> (default 250 / 251)."""
    shift = _QWEN2_SPECIALS["<|endoftext|>"] - bos_token_id
    ids = {name: i - shift for name, i in _QWEN2_SPECIALS.items()}
    ids.update(_TINY_TALKER_AUDIO_IDS if audio_ids is None else audio_ids)
    return ids


def _byte_chars() -> list[str]:
    """The byte-level alphabet: the character standing for each byte value 0..255 (GPT-2 mapping)."""
    printable = set(range(ord("!"), ord("~") + 1)) | set(range(ord("¡"), ord("¬") + 1)) | set(range(ord("®"), 256))
    chars, extra = [], 0
    for b in range(256):
        if b in printable:
            chars.append(chr(b))
        else:
            chars.append(chr(256 + extra))
            extra += 1
    return chars


def build_tiny_tokenizer(special_ids: Mapping[str, int], vocab_size: int = TINY_VOCAB_SIZE) -> Tokenizer:
    """Byte tokens on the ids left free by `special_ids` (ascending from 0), specials as added tokens."""
    taken = set(special_ids.values())
    if len(taken) != len(special_ids) or any(not 0 <= i < vocab_size for i in taken):
        raise ValueError("special ids must be distinct and inside the vocab")
    free = [i for i in range(vocab_size) if i not in taken][:256]
    if len(free) < 256:
        raise ValueError(f"vocab of {vocab_size} has no room for 256 byte tokens")
    vocab = {c: i for c, i in zip(_byte_chars(), free)}
    vocab.update(special_ids)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    data = json.loads(tok.to_str())
    # added tokens that also sit in the model vocab keep their ids on load
    data["added_tokens"] = [
        {"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": True}
        for t, i in sorted(special_ids.items(), key=lambda kv: kv[1])
    ]
    return Tokenizer.from_str(json.dumps(data))


def build_tiny_thinker_tokenizer() -> Tokenizer:
    return build_tiny_tokenizer(tiny_thinker_special_ids())


def build_tiny_talker_tokenizer() -> Tokenizer:
    return build_tiny_tokenizer(tiny_talker_special_ids())


def tiny_tokenizers_for(checkpoint, talker_audio_ids: Mapping[str, int] | None = None) -> tuple[Tokenizer, Tokenizer]:
    """(thinker, talker) tiny tokenizers on the special ids of `checkpoint` (a CheckpointConfig of a tiny
    checkpoint, e.g. a fixture set), in a vocab of at least 512 ids (256 bytes + specials: like the shipped
    talker tokenizer, byte ids may exceed a tiny talker LM's vocab); `talker_audio_ids` places <audio> /
    <audioPatch> (not in any config; default 250 / 251)."""
    thinker = checkpoint.thinker
    talker_lm = checkpoint.talker.llm
    thinker_ids = tiny_thinker_special_ids(thinker.eos_token_id)
    if talker_lm.bos_token_id is None:
        raise ValueError("the talker LM config has no bos_token_id to place the tiny talker tokenizer's ids")
    talker_ids = tiny_talker_special_ids(talker_lm.bos_token_id, talker_audio_ids)
    return (build_tiny_tokenizer(thinker_ids, max(thinker.vocab_size, TINY_VOCAB_SIZE)),
            build_tiny_tokenizer(talker_ids, max(talker_lm.vocab_size, TINY_VOCAB_SIZE)))


def tiny_tokenizer_path(kind: str) -> Path:
    """Shipped tokenizer.json of the tiny "thinker" or "talker"."""
    if kind not in ("thinker", "talker"):
        raise ValueError(f"kind must be 'thinker' or 'talker', got {kind!r}")
    return TINY_TOKENIZER_DIR / kind / "tokenizer.json"


def tiny_thinker_tokenizer() -> ThinkerTokenizer:
    """The shipped tiny thinker tokenizer wrapped as a ThinkerTokenizer."""
    return ThinkerTokenizer.from_file(tiny_tokenizer_path("thinker"))


def write_tiny_tokenizers(folder: Path = TINY_TOKENIZER_DIR) -> None:
    """(Re)write thinker/tokenizer.json and talker/tokenizer.json under `folder`."""
    for kind, tok in (("thinker", build_tiny_thinker_tokenizer()), ("talker", build_tiny_talker_tokenizer())):
        (folder / kind).mkdir(parents=True, exist_ok=True)
        tok.save(str(folder / kind / "tokenizer.json"), pretty=True)


if __name__ == "__main__":
    write_tiny_tokenizers()
