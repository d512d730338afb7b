"""The speculative turn of a session's server-VAD input: submitted at a pause, confirmed at speech stop,
discarded when the user goes on or the conversation changes under it (docs/turn_detection.md)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .actions import Action, DiscardTurn

__all__ = ["Speculation", "SpeculativeTurn"]


@dataclass(frozen=True, slots=True)
class SpeculativeTurn:
    """A speculative turn submitted at a pause: its id and the exact user audio it heard."""

    turn_id: str
    audio: np.ndarray  # [n] float32 16 kHz


class Speculation:
    """The session's one speculative turn, if any (not thread-safe)."""

    def __init__(self) -> None:
        self._turn: SpeculativeTurn | None = None

    @property
    def pending(self) -> bool:
        """A speculative turn waits for its confirmation."""
        return self._turn is not None

    def begin(self, turn_id: str, audio: np.ndarray) -> None:
        """Turn `turn_id` was submitted over `audio` (the user's speech so far)."""
        self._turn = SpeculativeTurn(turn_id, audio)

    def take(self) -> SpeculativeTurn | None:
        """The speech ended: the waiting turn (to confirm or discard), no longer pending."""
        turn, self._turn = self._turn, None
        return turn

    def discard(self) -> list[Action]:
        """The conversation or the input changed: the waiting turn is stale (its engine turn is dropped)."""
        turn = self.take()
        return [] if turn is None else [DiscardTurn(turn.turn_id)]
