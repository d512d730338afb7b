"""Thinker tokenizer: `tokenizer.json` lookup, the Ming chat template, and UTF-8-safe streaming decode.

Reproduces `BailingTokenizer` (fast tokenizer, no BOS/EOS added) and the Python processor's chat
format (`processing_bailingmm2.BailingMM2Processor.apply_chat_template`, docs/model.md §1.6, §4),
not the Jinja template. Prompts come out as ids plus media bookkeeping (multimodal.py). The tiny
byte-level tokenizers for the CPU default live in tiny_tokenizer.py.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from tokenizers import Tokenizer

from .multimodal import AudioInput, ImageInput, MediaTokenIds, MultimodalPrompt, PromptBuilder, VideoInput

__all__ = [
    "ChatMessage",
    "PromptTooLong",
    "ThinkerTokenizer",
    "IncrementalDecoder",
    "TokenizerNotFoundError",
    "TokenizerMismatchError",
    "CONFIG_TOKEN_FIELDS",
    "check_talker_tokenizer",
    "resolve_tokenizer",
    "DEFAULT_SYSTEM_PROMPT",
    "ASSETS_DIR",
    "MING_TOKENIZER_DIR",
    "HF_TOKENIZER_REPO",
]

ASSETS_DIR = Path(__file__).resolve().parent.parent / "assets"
MING_TOKENIZER_DIR = ASSETS_DIR / "ming_tokenizer"  # tokenizer_config.json, special_tokens_map.json (MIT)
HF_TOKENIZER_REPO = "inclusionAI/Ming-flash-omni-Preview"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")

DEFAULT_SYSTEM_PROMPT = "你是一个友好的AI助手。"
_THINKING = "\n\ndetailed thinking {}"
_ROLE_TAGS = {"user": "HUMAN", "assistant": "ASSISTANT"}
_REQUIRED = ("<role>", "</role>", "<|role_end|>")
# the chat template's tool block (rendered into the system turn when tools are given) and tool markers
TOOL_MARKERS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")
_TOOLS_HEAD = ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
               "You are provided with function signatures within <tools></tools> XML tags:\n<tools>")
_TOOLS_TAIL = ("\n</tools>\n\nFor each function call, return a json object with function name and arguments "
               "within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, "
               "\"arguments\": <args-json-object>}\n</tool_call>\n")


# text longer than this is encoded in pieces cut before a single space (where a regex pre-tokenizer starts a
# new word anyway, so the ids are the same): encoding stops as soon as a bound is passed, and the GIL is
# released between pieces (one `encode` call holds it throughout)
_PIECE_CHARS = 16384


class PromptTooLong(ValueError):
    """A prompt part would take more than its bound; `num_tokens` counts what was encoded when that was known
    (a lower bound of the whole, above the bound)."""

    def __init__(self, num_tokens: int, max_tokens: int):
        super().__init__(f"more than {max_tokens} tokens (at least {num_tokens})")
        self.num_tokens = num_tokens
        self.max_tokens = max_tokens


def _pieces(text: str, size: int):
    """`text` in pieces of at most `size` characters, each after the first starting at a space that follows a
    non-space and precedes one (a word boundary of GPT-2 / Qwen2 style pre-tokenizers); cut at `size` where a
    window has no such space."""
    start = 0
    while len(text) - start > size:
        cut = text.rfind(" ", start + 1, start + size)
        while cut > start and (text[cut - 1].isspace() or text[cut + 1].isspace()):
            cut = text.rfind(" ", start + 1, cut)
        if cut <= start:
            cut = start + size
        yield text[start:cut]
        start = cut
    yield text[start:]


class _BoundedEncoder:
    """`encode` over pieces of the text, raising PromptTooLong once the ids of every call together pass `max_tokens`
    (the specials a builder adds between calls are not counted: the caller checks the total)."""

    def __init__(self, encode, max_tokens: int):
        self._encode = encode
        self.max_tokens = max_tokens
        self.num_tokens = 0

    def __call__(self, text: str) -> list[int]:
        ids: list[int] = []
        for piece in _pieces(text, _PIECE_CHARS):
            ids += self._encode(piece)
            if self.num_tokens + len(ids) > self.max_tokens:
                raise PromptTooLong(self.num_tokens + len(ids), self.max_tokens)
        self.num_tokens += len(ids)
        return ids


class TokenizerNotFoundError(FileNotFoundError):
    """No thinker tokenizer.json where we looked; the message says what to download and where."""


class TokenizerMismatchError(ValueError):
    """The tokenizer does not belong to the checkpoint: its special ids or vocab disagree with the config.
    The message is one line naming every disagreement."""


# thinker config field -> the token whose id it holds (`video_start_token` is left out: the released
# config puts the id of `</image>` there, a mislabel the reference reproduces)
CONFIG_TOKEN_FIELDS = {"eos_token_id": "<|role_end|>", "pad_token_id": "<|endoftext|>",
                       "image_patch_token": "<imagePatch>", "video_patch_token": "<framePatch>",
                       "image_start_token": "<image>"}


@dataclass(frozen=True, slots=True)
class ChatMessage:
    """One conversation turn: role "user" or "assistant"; content text or text/media items in order."""

    role: str
    content: str | tuple[str | ImageInput | AudioInput | VideoInput, ...]
    tool_calls: tuple[tuple[str, str], ...] = ()  # assistant: (name, arguments JSON text) per call

    def __post_init__(self):
        if self.role not in (*_ROLE_TAGS, "tool"):
            raise ValueError(f"chat role must be 'user', 'assistant' or 'tool', got {self.role!r}")


class IncrementalDecoder:
    """Streaming detokenizer: feed ids one by one, get text deltas that never end inside a character.

    A delta is released only when the decoded window does not end with U+FFFD (an incomplete UTF-8
    sequence); `flush()` releases whatever is left at the end. Special tokens are skipped by default.
    Not thread-safe: one instance per stream.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = True):
        self._tok = tokenizer
        self._skip = skip_special_tokens
        self._ids: list[int] = []
        self._prefix = 0  # window start: the last emitted token boundary
        self._read = 0  # tokens up to here are already in `text`
        self.text = ""

    def _decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=self._skip) if ids else ""

    def _advance(self, final: bool) -> str:
        done = self._decode(self._ids[self._prefix:self._read])
        window = self._decode(self._ids[self._prefix:])
        if len(window) <= len(done) or (not final and window.endswith("\ufffd")):
            return ""
        delta = window[len(done):]
        self._prefix, self._read = self._read, len(self._ids)
        self.text += delta
        return delta

    def push(self, token_id: int) -> str:
        """Add one generated id; returns the newly complete text ("" while a character is incomplete)."""
        self._ids.append(int(token_id))
        return self._advance(final=False)

    def flush(self) -> str:
        """End of stream: return any withheld text (an incomplete character decodes as U+FFFD)."""
        return self._advance(final=True)


def _token_name(value) -> str | None:
    if isinstance(value, dict):
        return value.get("content")
    return value


class ThinkerTokenizer:
    """The Ming thinker tokenizer over a `tokenizers.Tokenizer` (real or tiny; same token names)."""

    def __init__(self, tokenizer: Tokenizer, *, eos_token: str = "<|role_end|>", pad_token: str = "<|endoftext|>"):
        self.tokenizer = tokenizer
        missing = [t for t in (*_REQUIRED, eos_token) if tokenizer.token_to_id(t) is None]
        if missing:
            raise ValueError(f"tokenizer lacks Ming tokens: {', '.join(missing)}")
        self.media = MediaTokenIds.from_token_map(tokenizer.token_to_id)
        self.eos_id = tokenizer.token_to_id(eos_token)
        pad = tokenizer.token_to_id(pad_token)
        self.pad_id = self.eos_id if pad is None else pad
        self._role, self._role_close, self._role_end = (tokenizer.token_to_id(t) for t in _REQUIRED)
        # user/assistant text is literal: "<role>" typed by a user must not become a control token
        self._literal = Tokenizer.from_str(tokenizer.to_str())
        self._literal.encode_special_tokens = True
        added = tokenizer.get_added_tokens_decoder()
        self.special_ids = frozenset(i for i, tok in added.items() if tok.special)

    @classmethod
    def from_file(cls, tokenizer_json: str | Path) -> "ThinkerTokenizer":
        """Load tokenizer.json; eos/pad names come from a tokenizer_config.json beside it, else the shipped one."""
        path = Path(tokenizer_json)
        config_path = path.parent / "tokenizer_config.json"
        if not config_path.is_file():
            config_path = MING_TOKENIZER_DIR / "tokenizer_config.json"
        config = json.loads(config_path.read_text(encoding="utf-8"))
        try:
            tok = Tokenizer.from_file(str(path))
        except Exception as exc:  # the tokenizers library raises a bare Exception on bad JSON
            raise ValueError(f"cannot read tokenizer {path}: {exc}") from exc
        return cls(tok, eos_token=_token_name(config.get("eos_token")) or "<|role_end|>")

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size()

    def check_config(self, cfg, source: str = "tokenizer") -> None:
        """Raise TokenizerMismatchError unless every special id the thinker config (`llm_config`) names is
        this tokenizer's id of that token and every token id fits the config's vocab_size."""
        problems = []
        for field, token in CONFIG_TOKEN_FIELDS.items():
            want, got = getattr(cfg, field), self.tokenizer.token_to_id(token)
            if want != got:
                problems.append(f"{token} is {got} in the tokenizer but {field}={want} in the config")
        top = max(self.tokenizer.get_vocab(with_added_tokens=True).values())
        if top >= cfg.vocab_size:
            problems.append(f"token id {top} does not fit the config's vocab_size={cfg.vocab_size}")
        if problems:
            raise TokenizerMismatchError(f"{source} does not match the checkpoint config: " + "; ".join(problems)
                                         + " (pass the checkpoint's own tokenizer with --tokenizer)")

    def token_id(self, token: str) -> int:
        """Id of a token by name; KeyError if absent."""
        tid = self.tokenizer.token_to_id(token)
        if tid is None:
            raise KeyError(token)
        return tid

    def encode(self, text: str) -> list[int]:
        """Literal text -> ids (special-token spellings inside `text` are not parsed)."""
        return self._literal.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def incremental_decoder(self, skip_special_tokens: bool = True) -> IncrementalDecoder:
        return IncrementalDecoder(self.tokenizer, skip_special_tokens)

    def system_ids(self, system: str | None = None, *, tools: Sequence[Mapping] = (), thinking: bool = False,
                   max_tokens: int | None = None) -> list[int]:
        """The system turn as `build_prompt` renders it: `<role>SYSTEM</role>{system}…<|role_end|>`, tools included.

        With `max_tokens`, raises PromptTooLong as soon as the turn is known to take more: the text is encoded in
        pieces (tool by tool, long text cut at word boundaries), so the work is bounded by `max_tokens`, not by the
        size of the instructions and tools (megabytes of tools are refused after about `max_tokens` tokens of them).
        """
        encode = self.encode if max_tokens is None else _BoundedEncoder(self.encode, max_tokens)
        b = PromptBuilder(encode, self.media)
        self._turn(b, "SYSTEM")
        head = DEFAULT_SYSTEM_PROMPT if system is None else system
        thinking_line = _THINKING.format("on" if thinking else "off")
        if tools:
            b.text(head + "\n\n")
            self._markup(b, _TOOLS_HEAD + "\n")
            for tool in tools:  # "\n".join of the tools, then the tail (which opens with its own "\n")
                self._markup(b, json.dumps(tool, ensure_ascii=False) + "\n")
                if max_tokens is not None:  # cut after "}\n": a pre-token boundary (the text is the same)
                    b.flush()
            self._markup(b, _TOOLS_TAIL[1:])
            b.text(thinking_line[2:])
        else:
            b.text(head).text(thinking_line)
        b.special(self._role_end)
        if max_tokens is not None and b.num_tokens > max_tokens:
            raise PromptTooLong(b.num_tokens, max_tokens)
        return list(b.build().input_ids)

    def build_prompt(self, messages: Sequence[ChatMessage], *, system: str | None = None, thinking: bool = False,
                     add_generation_prompt: bool = True, tools: Sequence[Mapping] = (),
                     system_ids: Sequence[int] | None = None) -> MultimodalPrompt:
        """Chat prompt in the official processor format (§1.6), media expanded in content order (§4).

        `<role>SYSTEM</role>{system}\\n\\ndetailed thinking off<|role_end|>` (system defaults to
        你是一个友好的AI助手。), then `<role>HUMAN</role>…<|role_end|>` / `<role>ASSISTANT</role>…<|role_end|>`
        per message, then `<role>ASSISTANT</role>` when `add_generation_prompt`. `system_ids` (the system turn
        as `system_ids` made it, e.g. cached) replaces `system`, `tools` and `thinking`.

        Tools (each a JSON object, written with `json.dumps` as the template's `tojson`) go between the
        system text and `detailed thinking`; an assistant message's `tool_calls` follow its text as
        `<tool_call>\\n{"name": …, "arguments": …}\\n</tool_call>`; consecutive "tool" messages share one
        `<role>OBSERVATION</role>` turn, each `\\n<tool_response>\\n…\\n</tool_response>` — exactly the
        checkpoint's chat template, with the tool markers as their special tokens.
        """
        b = PromptBuilder(self.encode, self.media)
        b.tokens(self.system_ids(system, tools=tools, thinking=thinking) if system_ids is None else system_ids)
        for i, msg in enumerate(messages):
            if msg.role == "tool":
                self._tool_response(b, msg, first=i == 0 or messages[i - 1].role != "tool",
                                    last=i == len(messages) - 1 or messages[i + 1].role != "tool")
                continue
            self._turn(b, _ROLE_TAGS[msg.role])
            items = (msg.content,) if isinstance(msg.content, str) else msg.content
            for item in items:
                b.add(item)
            has_text = any(isinstance(item, str) and item for item in items)
            for k, (name, arguments) in enumerate(msg.tool_calls):
                if k or has_text:
                    b.text("\n")
                self._markup(b, '<tool_call>\n{"name": "')
                b.text(f'{name}", "arguments": {arguments}')
                self._markup(b, "}\n</tool_call>")
            b.special(self._role_end)
        if add_generation_prompt:
            self._turn(b, "ASSISTANT")
        return b.build()

    def _turn(self, b: PromptBuilder, tag: str) -> None:
        b.special(self._role).text(tag).special(self._role_close)

    def _tool_response(self, b: PromptBuilder, msg: ChatMessage, *, first: bool, last: bool) -> None:
        if first:
            self._turn(b, "OBSERVATION")
        self._markup(b, "\n<tool_response>\n")
        b.text(msg.content if isinstance(msg.content, str) else "".join(i for i in msg.content if isinstance(i, str)))
        self._markup(b, "\n</tool_response>")
        if last:
            b.special(self._role_end)

    def _markup(self, b: PromptBuilder, text: str) -> None:
        """Template text whose tool markers are the special tokens (literal when the vocabulary lacks them)."""
        for piece in re.split("(" + "|".join(map(re.escape, TOOL_MARKERS)) + ")", text):
            tid = self.tokenizer.token_to_id(piece) if piece in TOOL_MARKERS else None
            if tid is not None:
                b.special(tid)
            elif piece:
                b.text(piece)

    def marker_ids(self) -> dict[int, str]:
        """Special-token id -> text of the tool markers this vocabulary has."""
        ids = {t: self.tokenizer.token_to_id(t) for t in TOOL_MARKERS}
        return {i: t for t, i in ids.items() if i is not None}

    def encode_markup(self, text: str) -> list[int]:
        """Text whose tool markers and `<|role_end|>` are their special tokens, the rest literal (forced text)."""
        b = PromptBuilder(self.encode, self.media)
        for piece in re.split(r"(<\|role_end\|>)", text):
            if piece == "<|role_end|>":
                b.special(self._role_end)
            elif piece:
                self._markup(b, piece)
        return list(b.build().input_ids)


def _missing_message(looked: list[Path]) -> str:
    files = ", ".join(TOKENIZER_FILES)
    where = "\n  ".join(str(p) for p in looked) or "(no checkpoint folder or --tokenizer path given)"
    target = looked[0].parent if looked else Path("<checkpoint folder>")
    return (
        f"thinker tokenizer not found; looked for:\n  {where}\n"
        f"Download {files} from the Hugging Face repo {HF_TOKENIZER_REPO}, e.g.\n"
        f"  huggingface-cli download {HF_TOKENIZER_REPO} {' '.join(TOKENIZER_FILES)} --local-dir {target}\n"
        f"and put them in the checkpoint folder ({target}), or pass --tokenizer <folder or tokenizer.json>."
    )


def resolve_tokenizer(checkpoint_dir: str | Path | None, tokenizer_path: str | Path | None = None) -> ThinkerTokenizer:
    """Find and load the thinker tokenizer: `<checkpoint_dir>/tokenizer.json`, then `tokenizer_path`
    (a tokenizer.json file or a folder holding one). Raises TokenizerNotFoundError saying which files
    to download and where."""
    looked: list[Path] = []
    if checkpoint_dir is not None:
        looked.append(Path(checkpoint_dir) / "tokenizer.json")
    if tokenizer_path is not None:
        p = Path(tokenizer_path)
        looked.append(p / "tokenizer.json" if p.is_dir() or p.suffix != ".json" else p)
    for path in looked:
        if path.is_file():
            return ThinkerTokenizer.from_file(path)
    raise TokenizerNotFoundError(_missing_message(looked))


_TALKER_CONFIG_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")


def check_talker_tokenizer(tokenizer: Tokenizer, llm_cfg, source: str = "talker tokenizer") -> None:
    """Raise TokenizerMismatchError unless the talker LM config's bos/eos ids are ids of the Qwen2 control
    tokens (<|endoftext|>, <|im_start|>, <|im_end|>) in this tokenizer."""
    problems = []
    for field in ("bos_token_id", "eos_token_id"):
        want = getattr(llm_cfg, field, None)
        if want is None:
            continue
        name = tokenizer.id_to_token(want)
        if name not in _TALKER_CONFIG_TOKENS:
            problems.append(f"{field}={want} in talker/llm/config.json is {name!r} in the tokenizer, not one of "
                            + ", ".join(_TALKER_CONFIG_TOKENS))
    if problems:
        raise TokenizerMismatchError(f"{source} does not match the checkpoint config: " + "; ".join(problems)
                                     + " (use the checkpoint's own talker tokenizer: talker/llm/tokenizer.json or engine.talker_tokenizer_path)")
