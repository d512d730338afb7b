"""The talker's caption (instruction) for speech style: dialect, style, rate, pitch, volume, emotion.

Ming's talker takes style control as a JSON caption placed after `<|im_start|>assistant\\n` and
closed with `<|im_end|>` (`build_talker_prompt(caption=…)`). The reference builds it in [MING]
`test_talker.py` (`BASE_CAPTION_TEMPLATE` + `create_instruction`, then
`json.dumps(caption, ensure_ascii=False)`): one `audio_sequence` entry with the keys 序号, 说话人,
方言, 风格, 语速, 基频, 音量, 情感, BGM {Genre, Mood, Instrument, Theme, ENV, SNR}, IP in that order,
unset values `null`, Chinese kept as is, Python's default separators (`", "`, `": "`). Values are
the Chinese labels the model was trained on: 语速 "快速", 基频 / 音量 "中" / "高", 情感 "高兴",
方言 "广粤话", 风格 a free-form description (the reference's own examples).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

__all__ = ["TalkerCaption"]

_SPEAKER = "speaker_1"
_BGM_KEYS = ("Genre", "Mood", "Instrument", "Theme", "ENV", "SNR")


@dataclass(frozen=True, slots=True)
class TalkerCaption:
    """Caption fields as the reference's Chinese labels; `None` = not set (`null` in the caption)."""

    dialect: str | None = None  # 方言
    style: str | None = None  # 风格
    rate: str | None = None  # 语速
    pitch: str | None = None  # 基频
    volume: str | None = None  # 音量
    emotion: str | None = None  # 情感

    def is_empty(self) -> bool:
        return all(v is None for v in (self.dialect, self.style, self.rate, self.pitch, self.volume, self.emotion))

    def instruction(self) -> str | None:
        """The caption text for the talker prompt, or None when nothing is set (no caption at all)."""
        if self.is_empty():
            return None
        entry = {
            "序号": 1,
            "说话人": _SPEAKER,
            "方言": self.dialect,
            "风格": self.style,
            "语速": self.rate,
            "基频": self.pitch,
            "音量": self.volume,
            "情感": self.emotion,
            "BGM": dict.fromkeys(_BGM_KEYS),
            "IP": None,
        }
        return json.dumps({"audio_sequence": [entry]}, ensure_ascii=False)
