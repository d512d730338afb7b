"""A token bucket on the session's clock (Sans-I/O: the caller passes the time).

The session's media rate bounds (`media_rate.MediaRate`): images (`server.limits.max_images_per_s`,
`max_image_burst`; a token is one image) and video (`max_video_s_per_s`, burst `max_video_s`; a token
is one second of video, so amounts are fractional). The bucket holds up to `burst` tokens, starts full
and refills at `rate` tokens per second; an amount is taken at once or not at all.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

__all__ = ["TokenBucket"]

_EPSILON = 1e-9  # a refill that lands a float rounding short of a whole token still counts it


@dataclass(slots=True)
class TokenBucket:
    """`rate` tokens per second, at most `burst` held; full until first used."""

    rate: float
    burst: float
    _tokens: float = field(init=False)
    _at: float | None = field(default=None, init=False)  # the time `_tokens` was counted at

    def __post_init__(self) -> None:
        if not all(v > 0 and math.isfinite(v) for v in (self.rate, self.burst)):
            raise ValueError("a token bucket needs a finite rate > 0 and a finite burst > 0")
        self._tokens = float(self.burst)

    def available(self, now: float) -> float:
        """Tokens held at `now` (times before the last one count as the last one)."""
        if self._at is None or now <= self._at:
            return self._tokens
        return min(float(self.burst), self._tokens + (now - self._at) * self.rate)

    def whole(self, now: float) -> int:
        """Whole tokens held at `now`."""
        return math.floor(self.available(now) + _EPSILON)

    def take(self, n: float, now: float) -> bool:
        """Take `n` tokens at `now` if all are there; False (nothing taken) otherwise."""
        tokens = self.available(now)
        self._at = now if self._at is None else max(self._at, now)
        self._tokens = tokens
        if n > tokens + _EPSILON:
            return False
        self._tokens = max(0.0, tokens - n)
        return True

    def wait_s(self, n: float, now: float) -> float:
        """Seconds from `now` until `n` tokens are held: 0 if they are, inf if `n` exceeds the burst."""
        if n > self.burst + _EPSILON:
            return math.inf
        missing = n - self.available(now)
        return 0.0 if missing <= _EPSILON else missing / self.rate
