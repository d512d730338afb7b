"""Speech style extension: `realtime_ming.speech` on the session and on `response.create`.

`{"emotion", "dialect", "pitch", "volume", "style"}` (all optional, `null` = unset) plus the
session's `audio.output.speed` (or the response's `realtime_ming.speed`) become the talker caption
(`model/talker_caption.py`). Each value is a documented keyword or the model's own Chinese label:

| field | keywords → caption label | Chinese labels accepted |
| `emotion` | happy 高兴, sad 悲伤, angry 生气, surprised 惊讶, fearful 恐惧, disgusted 厌恶, neutral 中性 | any, ≤ 16 chars |
| `dialect` | cantonese 广粤话 | any, ≤ 16 chars |
| `pitch`, `volume` | low 低, medium 中, high 高 | 低, 中, 高 |
| `style` | free-form description (the reference's voice-design captions), ≤ 300 chars | — |

`speed` 1.0 leaves 语速 unset; below 1.0 it is 慢速, above 1.0 快速 (the talker knows rate classes,
not a continuous rate). An unknown key, a wrong type or an unlisted value is `invalid_speech_style`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, Final

from realtime_ming.protocol.dialect import Dialect
from realtime_ming.protocol.error_codes import ErrorCode
from realtime_ming.protocol.errors import MAX_QUOTE_CHARS, ProtocolError, clip
from realtime_ming.protocol.wire import Codec, JsonValue, expect_object, join

__all__ = ["MAX_STYLE_CHARS", "SPEECH_STYLE", "SpeechStyle", "caption_labels", "rate_label"]

MAX_STYLE_CHARS: Final = 300  # the reference's longest style example is ~230 characters
_MAX_LABEL_CHARS: Final = 16
_CJK = re.compile(r"[\u4e00-\u9fff]")
_LEVELS: Final = {"low": "低", "medium": "中", "high": "高"}
_VOCABULARY: Final[dict[str, Mapping[str, str]]] = {
    "emotion": {"happy": "高兴", "sad": "悲伤", "angry": "生气", "surprised": "惊讶", "fearful": "恐惧",
                "disgusted": "厌恶", "neutral": "中性"},
    "dialect": {"cantonese": "广粤话"},
    "pitch": _LEVELS,
    "volume": _LEVELS,
}
_CLOSED: Final = frozenset({"pitch", "volume"})  # only the listed levels (keyword or label)
RATE_SLOW: Final = "慢速"
RATE_FAST: Final = "快速"


@dataclass(frozen=True, slots=True, kw_only=True)
class SpeechStyle:
    """The style as the client sent it (keywords or labels); `None` = unset."""

    emotion: str | None = None
    dialect: str | None = None
    pitch: str | None = None
    volume: str | None = None
    style: str | None = None

    def to_wire(self, _dialect: Dialect | None = None) -> JsonValue:
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}


_FIELDS: Final = tuple(f.name for f in fields(SpeechStyle))


def _error(param: str, detail: str) -> ProtocolError:
    return ProtocolError(ErrorCode.INVALID_SPEECH_STYLE, param=param, detail=detail)


def _label(name: str, value: str, param: str) -> str:
    """Validate one vocabulary value; returns it unchanged."""
    vocabulary = _VOCABULARY[name]
    if value in vocabulary or (name in _CLOSED and value in vocabulary.values()):
        return value
    if name not in _CLOSED and _CJK.search(value) and len(value) <= _MAX_LABEL_CHARS and value.strip() == value \
            and "\n" not in value:
        return value
    listed = ", ".join(vocabulary)
    extra = "" if name in _CLOSED else f", or a Chinese label of at most {_MAX_LABEL_CHARS} characters"
    raise _error(param, f"'{clip(value, MAX_QUOTE_CHARS)}' is not one of {listed}{extra}")


def _decode(value: Any, param: str, _dialect: Dialect) -> SpeechStyle:
    obj = expect_object(value, param)
    for key in obj:
        if key not in _FIELDS:
            raise _error(join(param, key), f"not a speech style field (fields: {', '.join(_FIELDS)})")
    values: dict[str, str] = {}
    for name in _FIELDS:
        raw = obj.get(name)
        if raw is None:
            continue
        field_param = join(param, name)
        if not isinstance(raw, str) or not raw.strip():
            raise _error(field_param, "expected a non-empty string or null")
        if name == "style":
            if len(raw) > MAX_STYLE_CHARS:
                raise _error(field_param, f"{len(raw)} characters, the limit is {MAX_STYLE_CHARS}")
            values[name] = raw
        else:
            values[name] = _label(name, raw, field_param)
    return SpeechStyle(**values)


SPEECH_STYLE: Final[Codec[SpeechStyle]] = Codec(_decode, lambda v, d: v.to_wire(d))


def rate_label(speed: float) -> str | None:
    """语速 for an OpenAI `speed` (0.25–1.5): None at 1.0, else the slow or fast class."""
    if speed < 1.0:
        return RATE_SLOW
    if speed > 1.0:
        return RATE_FAST
    return None


def caption_labels(style: SpeechStyle | None, speed: float) -> dict[str, str | None]:
    """The caption's Chinese labels (`TalkerCaption` keyword arguments) for `style` and `speed`."""
    labels: dict[str, str | None] = {"rate": rate_label(speed)}
    if style is None:
        return labels
    for name in ("emotion", "dialect", "pitch", "volume"):
        value = getattr(style, name)
        labels[name] = None if value is None else _VOCABULARY[name].get(value, value)
    labels["style"] = style.style
    return labels
