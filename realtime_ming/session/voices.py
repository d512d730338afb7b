"""The voices a session accepts: checkpoint presets, OpenAI's built-in names, the caller's cloned voices.

* a checkpoint preset (`DB30`, ...) is spoken as itself;
* each OpenAI built-in name (alloy, ash, ballad, coral, echo, sage, shimmer, verse, marin, cedar) is
  an alias of the server's default preset voice (documented in docs/protocol.md; the name is echoed
  back as sent), so OpenAI clients that send one by default keep working;
* a custom voice id (`voice_…`, GA `{"id": "voice_…"}`) names a voice registered with
  `POST /v1/realtime/voices` under the session's API key (`lookup`); another key's or an evicted
  voice is `voice_not_found`. The session's own voice (`hold`, set by `session.update`) stays
  resolvable for the session's lifetime even after the store evicts it, so its replies are never
  spoken in the default voice instead.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Sequence

from ..engine.api import CUSTOM_VOICE_PREFIX, CustomVoice
from ..protocol.error_codes import ErrorCode
from ..protocol.errors import ProtocolError

__all__ = ["OPENAI_VOICE_ALIASES", "SessionVoices"]

OPENAI_VOICE_ALIASES = ("alloy", "ash", "ballad", "coral", "echo", "sage", "shimmer", "verse", "marin", "cedar")

VoiceLookup = Callable[[str], CustomVoice | None]


class SessionVoices(Collection[str]):
    """Membership and engine mapping of a session's voice names; iterates the named (non-custom) voices."""

    def __init__(self, presets: Sequence[str], default: str, lookup: VoiceLookup | None = None) -> None:
        self.presets = tuple(presets)
        self.default = default
        self.aliases = {name: default for name in OPENAI_VOICE_ALIASES if name not in self.presets}
        self._named = self.presets + tuple(self.aliases)
        self._lookup = lookup
        self._held: CustomVoice | None = None  # the session's configured cloned voice (`hold`)

    def __contains__(self, voice: object) -> bool:
        return isinstance(voice, str) and (voice in self._named or self._custom(voice) is not None)

    def __iter__(self) -> Iterator[str]:
        return iter(self._named)

    def __len__(self) -> int:
        return len(self._named)

    def _custom(self, voice: str) -> CustomVoice | None:
        if self._lookup is None or not voice.startswith(CUSTOM_VOICE_PREFIX) or voice in self._named:
            return None
        found = self._lookup(voice)
        if found is None and self._held is not None and self._held.id == voice:
            return self._held
        return found

    def hold(self, voice: str) -> None:
        """`voice` is now the session's voice: a cloned one is kept for the session (evictions spare it)."""
        self._held = self._custom(voice)  # (the held voice itself when the store has lost it)

    def check(self, voice: str, param: str, event_id: str | None = None) -> None:
        """Raise ProtocolError (`voice_not_found` for a custom id, else `unknown_voice`) unless accepted."""
        if voice in self:
            return
        if voice.startswith(CUSTOM_VOICE_PREFIX):
            raise ProtocolError(ErrorCode.VOICE_NOT_FOUND, param=param, event_id=event_id, voice=voice)
        raise ProtocolError(ErrorCode.UNKNOWN_VOICE, param=param, event_id=event_id, voice=voice,
                            voices=", ".join(sorted(self._named)))

    def engine_voice(self, voice: str) -> str | CustomVoice:
        """What the engine speaks `voice` with: a preset's name or a cloned voice (unknown → the default)."""
        if voice in self.presets:
            return voice
        custom = self._custom(voice)
        return custom if custom is not None else self.aliases.get(voice, self.default)
