"""Stand-in word-piece tokenizers for dummy-weight runs at the real shapes (no tokenizer download).

Benchmarks with random weights at the full Ming-flash-omni-2.0 shapes still need tokenizers whose
special tokens sit on the real ids and whose token counts resemble the real ones: the thinker's
BPE (157k vocab) and the talker's Qwen2 BPE give about 1.2-1.4 tokens per English word, while a
byte-level tokenizer gives ~5, which would inflate every per-token latency 4x (the first segment
waits for three words). So these are byte-level BPEs trained at startup on a small built-in
English corpus (plus any extra text, e.g. a benchmark's forced reply), with their ids placed on
the free ids of the real vocabulary. They are not the real tokenizers: a model served from a
checkpoint always uses its own tokenizer.json.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

__all__ = ["CORPUS", "build_standin_tokenizer", "tokens_per_word"]

CORPUS = (
    "Sure. The weather today looks sunny, with a light breeze from the west and a high of twenty degrees.",
    "Hello! How are you doing today? I am fine, thank you for asking.",
    "What time is it now? It is about half past three in the afternoon.",
    "Could you tell me something about the sea, the mountains and the rivers of this country?",
    "Yes, of course. Here is a short answer to your question, and I hope it helps you.",
    "I think that we should go to the park after lunch if it does not rain.",
    "The quick brown fox jumps over the lazy dog while the children play in the garden.",
    "Please remember to buy some bread, milk, eggs and fresh fruit on your way home.",
    "My name is Ming. I can listen, look at pictures and talk with you in real time.",
    "There are seven days in a week, twelve months in a year and about four weeks in a month.",
    "Let me think about it for a moment. The best way to learn is to practice every day.",
    "This is a good idea, but we need more time to make a plan and to ask other people.",
    "Where would you like to go on holiday this summer: the beach, the city or the forest?",
    "One, two, three, four, five, six, seven, eight, nine, ten, first, second, last.",
    "Music, books, films and games are things that many people enjoy in their free time.",
    "Thank you very much. Goodbye, and have a nice evening!",
)


def build_standin_tokenizer(special_ids: Mapping[str, int], vocab_size: int, extra_text: Iterable[str] = (),
                            merges_vocab: int = 2048) -> Tokenizer:
    """A byte-level BPE trained on CORPUS + extra_text, its tokens on the ids `special_ids` leaves free.

    The special tokens keep their given ids (added tokens); every other id of the trained vocab moves to
    the next free id from 0 upwards, so all ids stay below `vocab_size`.
    """
    taken = set(special_ids.values())
    if len(taken) != len(special_ids) or any(not 0 <= i < vocab_size for i in taken):
        raise ValueError("special ids must be distinct and inside the vocab")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=merges_vocab, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([*CORPUS, *extra_text], trainer)
    data = json.loads(tok.to_str())
    trained = sorted(data["model"]["vocab"].items(), key=lambda kv: kv[1])
    free = [i for i in range(vocab_size) if i not in taken][:len(trained)]
    if len(free) < len(trained):
        raise ValueError(f"vocab of {vocab_size} has no room for {len(trained)} stand-in tokens")
    vocab = {t: i for (t, _), i in zip(trained, free)}
    vocab.update(special_ids)
    data["model"]["vocab"] = vocab
    data["added_tokens"] = [
        {"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": True}
        for t, i in sorted(special_ids.items(), key=lambda kv: kv[1])
    ]
    return Tokenizer.from_str(json.dumps(data))


def tokens_per_word(tok: Tokenizer, text: str) -> float:
    """Tokens per whitespace word of `text` (the figure benchmarks report next to their latencies)."""
    return len(tok.encode(text, add_special_tokens=False).ids) / max(1, len(text.split()))
