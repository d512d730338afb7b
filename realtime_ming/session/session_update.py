"""`session.update`: validate the patched configuration, then apply it to a `Session` at once.

A refused update (voice after the first audio response, an unavailable denoiser, a bad tool
choice, transcription or tracing value, a type change while a response runs, instructions, tools or a speech
style over their token budgets: `prompt_limits`) leaves the session as it was.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from ..audio.denoise import DenoiserUnavailable
from ..protocol import client_events as ce
from ..protocol.errors import ErrorCode
from ..protocol.server_events import SessionUpdated
from ..protocol.session import apply_patch
from .actions import Action, Send
from .mcp import check_mcp_tools
from .tools import check_tool_choice
from .tracing import check_tracing_update
from .transcription import check_transcription, transcription_session_defaults

if TYPE_CHECKING:
    from .session import Session

__all__ = ["on_session_update"]


def on_session_update(session: Session, event: ce.SessionUpdate, now: float) -> list[Action]:
    if "voice" in event.session.changes:
        session._accepted_voices.check(event.session.changes["voice"], event.session.param("voice"))
    new = apply_patch(session.config, event.session, voices=session._accepted_voices)
    if new.session_type is not session.config.session_type:
        if session._response is not None or session._oob:
            return session._error(ErrorCode.SESSION_TYPE_CHANGE_WHILE_RESPONDING, event.event_id, param="session.type")
        new = transcription_session_defaults(new, session._served_model)
    if "transcription" in event.session.changes:
        new = replace(new, transcription=check_transcription(
            new.transcription, session._served_model, event.session.param("transcription")))
    check_tool_choice(new.tools, new.tool_choice, event.session.param("tool_choice"))
    if "tools" in event.session.changes:
        check_mcp_tools(new.tools, session.mcp_allowed_hosts, event.session.param("tools"))
    session.prompt_limits.check_update(new, event.session)
    if new.voice != session.config.voice and session._has_spoken:
        return session._error(ErrorCode.CANNOT_UPDATE_VOICE, event.event_id, param=event.session.param("voice"))
    if "tracing" in event.session.changes:
        check_tracing_update(session.config, new, event.session.param("tracing"))
    if new.noise_reduction != session.config.noise_reduction:
        try:
            session._input.set_noise_reduction(new.noise_reduction)
        except DenoiserUnavailable as exc:  # refuse rather than echo a setting that would not act
            assert new.noise_reduction is not None
            return session._error(ErrorCode.UNSUPPORTED_NOISE_REDUCTION, event.event_id,
                                  param=event.session.param("noise_reduction"),
                                  kind=new.noise_reduction.type.value, detail=str(exc))
    old, session.config = session.config, new
    if new.voice != old.voice:
        session._accepted_voices.hold(new.voice)
    actions = session._discard_speculation()
    if (new.input_format, new.turn_detection) != (old.input_format, old.turn_detection):
        session._input.configure(new.input_format, new.turn_detection)
    actions.append(Send(SessionUpdated(session=new)))
    return actions + session.mcp.list_new(new.tools)
