"""Whether a client frame carries media (audio, images, video), told from its text without decoding it.

The protocol carries media only as a JSON string under one of `MEDIA_KEYS`: `input_audio_buffer.append`'s and an
audio part's `audio` (base64), an `input_image` part's or a video frame's `image_url` (a data URL), an
`input_video` part's `video_url` (the server's extension). A frame in which no object has such a key with a string
value carries no media (`carries_media`, on the decoded value). A frame's text shows such a key as `"audio"`,
optional JSON whitespace, `:`, optional whitespace and the value's opening `"` (the key's and the value's quotes are
never escaped); its letters may be written as `\\u00XX` escapes (`"\\u0061udio"`), and only escapes of printable
ASCII (`\\u0020`..`\\u007f`) can spell them. So a text with neither such a key nor such an escape carries no media
(`may_carry_media`, `MediaScan`): the scan may say "may" of a frame without media (a key inside another string, more
whitespace than it looks through, an escape of any ASCII character), never "no" of a frame with media. The scans are
regular expressions run by C code: microseconds per kilobyte, a read at a time for a frame still arriving
(server/big_frames.py), with an overlap of one match's length at each read's boundary.
"""

from __future__ import annotations

import re
from typing import Any, Final

__all__ = ["MEDIA_KEYS", "MediaScan", "carries_media", "may_carry_media"]

MEDIA_KEYS: Final = ("audio", "image_url", "video_url")
_WS_RUN: Final = 64  # whitespace looked through around the colon; more of it counts as "may carry media"


def _patterns(ws: str) -> tuple[str, str]:
    """(a media key with a string value, or with more whitespace than `_WS_RUN`; an ASCII `\\u` escape)."""
    keys = "|".join(MEDIA_KEYS)
    over = f"{ws}{{{_WS_RUN + 1}}}"
    within = f"{ws}{{0,{_WS_RUN}}}"
    return f'"(?:{keys})"(?:{over}|{within}:(?:{over}|{within}"))', r"\\u00[2-7]"


_KEY_TEXT, _ESCAPE_TEXT = _patterns(r"[ \t\r\n]")
_KEY: Final = re.compile(_KEY_TEXT)
_ESCAPE: Final = re.compile(_ESCAPE_TEXT)
_KEY_BYTES: Final = re.compile(_KEY_TEXT.encode())
_ESCAPE_BYTES: Final = re.compile(_ESCAPE_TEXT.encode())
# the longest match of each: the bytes of a read's start scanned again with the next read
_KEY_SPAN: Final = 2 + max(map(len, MEDIA_KEYS)) + 2 * _WS_RUN + 2
_ESCAPE_SPAN: Final = len("\\u00X")


def may_carry_media(text: str) -> bool:
    """False only when the JSON text `text` carries no media (see the module doc)."""
    return _ESCAPE.search(text) is not None or _KEY.search(text) is not None


class MediaScan:
    """`may_carry_media` of a frame's UTF-8 bytes as they arrive: `feed` it the buffer after each read."""

    def __init__(self) -> None:
        self.found = False  # a media key or an ASCII escape was seen: the frame may carry media
        self._scanned = 0  # bytes of the buffer scanned so far

    def feed(self, buffer: Any, end: int) -> bool:
        """Scan `buffer[:end]` (a bytes-like object that grew from what was fed before); whether media may be in it.
        The work is the new bytes and one match's length before them, once `found` none."""
        if not self.found and end > self._scanned:
            start = self._scanned
            escapes = max(0, start - _ESCAPE_SPAN + 1)
            # a backslash first (memchr: most JSON has none), the escapes' expression only where there is one
            self.found = ((buffer.find(b"\\", escapes, end) != -1
                           and _ESCAPE_BYTES.search(buffer, escapes, end) is not None)
                          or _KEY_BYTES.search(buffer, max(0, start - _KEY_SPAN + 1), end) is not None)
            self._scanned = end
        return self.found


def carries_media(value: Any) -> bool:
    """Whether a decoded frame has, anywhere, an object with a string under one of `MEDIA_KEYS` (iterative: any
    nesting; stops at the first)."""
    stack = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            for key, item in node.items():
                if isinstance(item, str):
                    if key in MEDIA_KEYS:
                        return True
                elif isinstance(item, dict | list):
                    stack.append(item)
        elif isinstance(node, list):
            stack.extend(item for item in node if isinstance(item, dict | list))
    return False
