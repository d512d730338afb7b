"""The session's media rate bounds (issue 19: camera images and video clips "bounded in size and rate").

Two token buckets on the session's clock (`rate_limit.TokenBucket`; Sans-I/O, the caller passes the time):
- images: every `input_image` part takes one token (`max_images_per_s` sustained, `max_image_burst` at once);
- video: every `input_video` clip takes its span in seconds, first to last frame as `max_video_s` measures
  it (`max_video_s_per_s` sustained, `max_video_s` at once, so one longest clip fits a full bucket). A
  clip takes at least one sampling period (1 / the model's 2 fps, never more than `max_video_s`): a
  one-frame clip is still a frame to encode, so a flood of them is bounded too.
An event's media take their tokens all at once, from both buckets, or none; over either bound it is
refused with `image_rate_limited` / `video_rate_limited` naming the first part over.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from ..protocol.error_codes import ErrorCode
from ..protocol.errors import ProtocolError
from .content import MediaLimits
from .rate_limit import TokenBucket

__all__ = ["MediaRate"]


class MediaRate:
    """The image and video buckets of one session."""

    def __init__(self, limits: MediaLimits) -> None:
        self._limits = limits
        self.images = TokenBucket(limits.max_images_per_s, limits.max_image_burst)
        self.video = TokenBucket(limits.max_video_s_per_s, limits.max_video_s)
        self._min_clip_s: float | None = None  # on the first clip: the sampling constants live beside torch code,
        # which a front-end process that never sees a clip must not import

    def clip_cost_s(self, span_s: float) -> float:
        """Video seconds a clip of `span_s` (first to last frame) takes: at least one sampling period."""
        if self._min_clip_s is None:
            self._min_clip_s = min(1.0 / self._limits.video_sampling.fps, self._limits.max_video_s)
        return max(span_s, self._min_clip_s)

    def images_refused(self, count: int, now: float) -> bool:
        """Whether `count` images would be refused at `now` (reads only: safe off the session's path)."""
        return count > 0 and self.images.wait_s(count, now) > 0

    def video_refused(self, costs_s: Sequence[float], now: float) -> bool:
        """Whether clips taking `costs_s` would be refused at `now` (reads only)."""
        return bool(costs_s) and self.video.wait_s(math.fsum(costs_s), now) > 0

    def check_images(self, params: Sequence[str], now: float) -> None:
        """Raise `image_rate_limited` naming the first image over the bound if `params` do not fit now."""
        if not self.images_refused(len(params), now):
            return
        available = self.images.whole(now)
        wait_s = self.images.wait_s(len(params), now)
        if math.isinf(wait_s):
            detail = f"are more than one burst holds: send at most {self._limits.max_image_burst} per event"
        else:
            detail = f"exceed the {available} left now (retry in {wait_s:.2f} s)"
        raise ProtocolError(ErrorCode.IMAGE_RATE_LIMITED, param=params[available], rate=self._limits.max_images_per_s,
                            burst=self._limits.max_image_burst, images=len(params), detail=detail)

    def check_video(self, clips: Sequence[tuple[str, float]], now: float) -> None:
        """Raise `video_rate_limited` naming the first clip over the bound if `clips` ((param, cost_s)) do not
        fit now."""
        costs = [cost for _param, cost in clips]
        if not self.video_refused(costs, now):
            return
        available = self.video.available(now)
        seconds = math.fsum(costs)
        wait_s = self.video.wait_s(seconds, now)
        over = next(k for k in range(len(costs)) if self.video.wait_s(math.fsum(costs[:k + 1]), now) > 0)
        if math.isinf(wait_s):
            detail = f"are more than one burst holds: send at most {self._limits.max_video_s:g} s per event"
        else:
            detail = f"exceed the {available:.2f} s left now (retry in {wait_s:.2f} s)"
        raise ProtocolError(ErrorCode.VIDEO_RATE_LIMITED, param=clips[over][0], rate=self._limits.max_video_s_per_s,
                            burst=self._limits.max_video_s, clips=len(clips), seconds=seconds, detail=detail)

    def admit(self, image_params: Sequence[str], clips: Sequence[tuple[str, float]], now: float) -> None:
        """Take one image token per param and each clip's seconds at `now`, all or none; raises the error of
        the first bound they exceed (images first), having taken nothing."""
        self.check_images(image_params, now)
        self.check_video(clips, now)
        if image_params:
            self.images.take(len(image_params), now)  # fits: checked above, at the same `now`
        if clips:
            self.video.take(math.fsum(cost for _param, cost in clips), now)
