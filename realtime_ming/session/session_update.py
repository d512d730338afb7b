"""`session.update`: the patched configuration, validated before the session applies it.

A refused update (voice after the first audio response, an unavailable denoiser, a bad tool
choice, transcription or tracing value, a type change while a response runs, instructions, tools or a speech
style over their token budgets: `prompt_limits`) raises `ProtocolError` and leaves the session as it was.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..audio.denoise import DenoiserUnavailable
from ..protocol import client_events as ce
from ..protocol.error_codes import ErrorCode
from ..protocol.errors import ProtocolError
from ..protocol.session import SessionConfig, apply_patch
from .input import InputTurns
from .mcp import check_mcp_tools
from .prompt_limits import PromptLimits
from .tools import check_tool_choice
from .tracing import check_tracing_update
from .transcription import check_transcription, transcription_session_defaults
from .voices import SessionVoices

__all__ = ["UpdateRefused", "UpdateRules", "updated_config"]


class UpdateRefused(Exception):
    """The update asks for what this session cannot do now (a type change while responding, a voice change after
    it spoke, an unavailable denoiser): answered with `error`, like a bad value."""

    def __init__(self, error: ProtocolError) -> None:
        super().__init__(str(error))
        self.error = error


@dataclass(frozen=True, slots=True)
class UpdateRules:
    """What a session's updates are checked against, fixed for its life."""

    voices: SessionVoices
    served_model: str
    mcp_allowed_hosts: frozenset[str]
    prompt_limits: PromptLimits


def updated_config(config: SessionConfig, event: ce.SessionUpdate, rules: UpdateRules, *, responding: bool,
                   has_spoken: bool, input_turns: InputTurns) -> SessionConfig:
    """`config` with the update of `event` applied and checked; the input's denoiser is switched already (the one
    check that needs it). Raises ProtocolError for a bad value, UpdateRefused for what the session cannot do now
    (the session is left as it was)."""
    patch = event.session
    if "voice" in patch.changes:
        rules.voices.check(patch.changes["voice"], patch.param("voice"))
    new = apply_patch(config, patch, voices=rules.voices)
    if new.session_type is not config.session_type:
        if responding:
            raise UpdateRefused(ProtocolError(ErrorCode.SESSION_TYPE_CHANGE_WHILE_RESPONDING, param="session.type"))
        new = transcription_session_defaults(new, rules.served_model)
    if "transcription" in patch.changes:
        new = replace(new, transcription=check_transcription(
            new.transcription, rules.served_model, patch.param("transcription")))
    check_tool_choice(new.tools, new.tool_choice, patch.param("tool_choice"))
    if "tools" in patch.changes:
        check_mcp_tools(new.tools, rules.mcp_allowed_hosts, patch.param("tools"))
    rules.prompt_limits.check_update(new, patch)
    if new.voice != config.voice and has_spoken:
        raise UpdateRefused(ProtocolError(ErrorCode.CANNOT_UPDATE_VOICE, param=patch.param("voice")))
    if "tracing" in patch.changes:
        check_tracing_update(config, new, patch.param("tracing"))
    if new.noise_reduction != config.noise_reduction:
        try:
            input_turns.set_noise_reduction(new.noise_reduction)
        except DenoiserUnavailable as exc:  # refuse rather than echo a setting that would not act
            assert new.noise_reduction is not None
            raise UpdateRefused(ProtocolError(
                ErrorCode.UNSUPPORTED_NOISE_REDUCTION, param=patch.param("noise_reduction"),
                kind=new.noise_reduction.type.value, detail=str(exc))) from exc
    return new
