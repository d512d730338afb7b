"""A session's prompt budgets, checked where settings are accepted (`session.update`, `response.create`).

The instructions and tools (the system turn every prompt opens with) are measured in thinker tokens and must leave
`SessionSettings.min_conversation_tokens` of the prompt budget (the context minus the reply's room,
`max_output_tokens`) for the conversation: `instructions_exceed_context`. The speech style (with `speed`) becomes a
talker caption measured in talker tokens against the talker's caption budget: `speech_style_too_long`.
`truncation.token_limits.post_instructions` must allow that minimum too: `token_limit_too_small`. So a setting that
would fail every turn is refused with its param, and the session keeps what it had.

Counts come from the engine's `PromptMeter` (bounded: megabytes of tools cost about a context's worth of encoding;
cached by the engine), taken on a worker thread before the handler runs (`premeasure`) and kept here per session, so
the handler finds them at once. Without a meter (scripted test engines) nothing is checked here; the engine's
turn-time checks remain.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass

from ..engine.api import PromptMeter, TalkerCaption
from ..protocol import client_events as ce
from ..protocol.dialect import Dialect
from ..protocol.error_codes import ErrorCode
from ..protocol.errors import ProtocolError
from ..protocol.session import SessionConfig, SessionType, apply_patch
from ..protocol.speech_style import caption_labels
from ..protocol.values import FunctionTool, ToolChoice
from .config import SessionSettings
from .tools import engine_tools

__all__ = ["PromptLimits", "PromptValues", "talker_caption"]

_SYSTEM_FIELDS = ("tools", "instructions", "tool_choice", "max_output_tokens")  # blame order
_CAPTION_FIELDS = ("speech", "speed")
_MAX_CACHED = 4  # system turns / captions remembered per session (the session's own and a few overrides)


def talker_caption(config: SessionConfig, params: ce.ResponseParams | None = None) -> str | None:
    """The talker caption for the speed and speech style of a response (its override, else the session's)."""
    p = params or ce.ResponseParams()
    speed = p.speed if p.speed is not None else config.speed
    style = p.speech if p.speech is not None else config.speech
    return TalkerCaption(**caption_labels(style, speed)).instruction()


@dataclass(frozen=True, slots=True)
class PromptValues:
    """What fixes the prompt of a response before any message: the session's values with a response's overrides."""

    instructions: str
    tools: tuple[FunctionTool, ...]
    tool_choice: ToolChoice
    max_output_tokens: int | str
    caption: str | None
    truncation: str | Mapping

    @classmethod
    def of(cls, config: SessionConfig, params: ce.ResponseParams | None = None) -> PromptValues:
        p = params or ce.ResponseParams()
        return cls(
            instructions=p.instructions if p.instructions is not None else config.instructions,
            tools=p.tools if p.tools is not None else config.tools,
            tool_choice=p.tool_choice if p.tool_choice is not None else config.tool_choice,
            max_output_tokens=p.max_output_tokens if p.max_output_tokens is not None else config.max_output_tokens,
            caption=talker_caption(config, params),
            truncation=config.truncation,
        )


class PromptLimits:
    """The budgets of one session and the counts it measured (not thread-safe: the session's owner calls
    `premeasure` on a worker thread only while the session is otherwise idle, as `Session.predecode`)."""

    def __init__(self, meter: PromptMeter | None, settings: SessionSettings) -> None:
        self.meter = meter
        self._settings = settings
        self._systems: list[tuple[str, tuple[FunctionTool, ...], bool, int]] = []  # instructions, tools, rendered, n
        self._captions: dict[str, int] = {}

    # ---- measuring -----------------------------------------------------------------------------------------------
    def _system_tokens(self, v: PromptValues) -> int:
        tools = engine_tools(v.tools, v.tool_choice)[0]
        rendered = bool(tools)
        for instructions, kept, was_rendered, n in self._systems:
            if kept is v.tools and was_rendered == rendered and instructions == v.instructions:
                return n
        assert self.meter is not None
        n = self.meter.system_tokens(v.instructions or None, tools)
        self._systems = [(v.instructions, v.tools, rendered, n), *self._systems][:_MAX_CACHED]
        return n

    def _caption_tokens(self, caption: str) -> int:
        if caption not in self._captions:
            assert self.meter is not None
            if len(self._captions) >= _MAX_CACHED:
                self._captions.pop(next(iter(self._captions)))
            self._captions[caption] = self.meter.caption_tokens(caption)
        return self._captions[caption]

    def wants(self, event: object) -> bool:
        """Whether `event` sets what this session measures (`premeasure_event` is worth a worker thread)."""
        return self.meter is not None and isinstance(event, (ce.SessionUpdate, ce.ResponseCreate))

    def premeasure_event(self, config: SessionConfig, event: object) -> None:
        """Measure what a `session.update` or `response.create` over `config` would set into this session's counts
        (a worker thread, ahead of the handler that checks them); an event that is invalid anyway is left to it."""
        if not self.wants(event):
            return
        try:
            if isinstance(event, ce.SessionUpdate):
                v = PromptValues.of(apply_patch(config, event.session))
            else:
                assert isinstance(event, ce.ResponseCreate)
                v = PromptValues.of(config, event.response)
            self._system_tokens(v)
            if v.caption is not None:
                self._caption_tokens(v.caption)
        except Exception:  # noqa: BLE001 -- an invalid event, or a meter that failed: the handler meets it again
            return

    # ---- checking ------------------------------------------------------------------------------------------------
    def check(self, v: PromptValues, changed: Collection[str], param_of: Callable[[str], str]) -> None:
        """Raise ProtocolError when a changed field makes the prompt of every response too long: the system turn
        (`instructions_exceed_context`), the talker caption (`speech_style_too_long`) or the history's token limit
        (`token_limit_too_small`). `param_of(field)` is the field's wire param."""
        meter = self.meter
        if meter is None:
            return
        min_tokens = self._settings.min_conversation_tokens
        if "truncation" in changed and isinstance(v.truncation, Mapping):
            limit = (v.truncation.get("token_limits") or {}).get("post_instructions")
            if limit is not None and limit < min_tokens:
                raise ProtocolError(ErrorCode.TOKEN_LIMIT_TOO_SMALL,
                                    param=param_of("truncation") + ".token_limits.post_instructions",
                                    value=limit, min_tokens=min_tokens)
        blamed = [f for f in _SYSTEM_FIELDS if f in changed]
        if blamed:
            reply = self._settings.max_output_tokens if v.max_output_tokens == "inf" else int(v.max_output_tokens)
            reply = min(reply, meter.max_seq_len // 2)  # as the engine's prompt budget: a reply takes at most half
            num_tokens = self._system_tokens(v)
            room = meter.max_seq_len - reply - num_tokens
            if room < min_tokens:
                field = blamed[0] if blamed[0] != "tools" or engine_tools(v.tools, v.tool_choice)[0] else "instructions"
                raise ProtocolError(ErrorCode.INSTRUCTIONS_EXCEED_CONTEXT, param=param_of(field), num_tokens=num_tokens,
                                    max_seq_len=meter.max_seq_len, reply_tokens=reply, room=max(room, 0),
                                    min_tokens=min_tokens)
        if v.caption is not None and any(f in changed for f in _CAPTION_FIELDS):
            num_tokens = self._caption_tokens(v.caption)
            if num_tokens > meter.caption_budget:
                field = next(f for f in _CAPTION_FIELDS if f in changed)
                raise ProtocolError(ErrorCode.SPEECH_STYLE_TOO_LONG, param=param_of(field), num_tokens=num_tokens,
                                    max_tokens=meter.caption_budget)

    def check_update(self, config: SessionConfig, patch) -> None:
        """`check` for a `session.update` whose result is `config` (`patch`: the `SessionPatch` applied)."""
        if config.session_type is SessionType.REALTIME:
            self.check(PromptValues.of(config), patch.changes.keys(), patch.param)

    def check_response(self, config: SessionConfig, params: ce.ResponseParams, dialect: Dialect) -> None:
        """`check` for the overrides of a `response.create` over the session's `config`."""
        changed = [f for f in (*_SYSTEM_FIELDS, *_CAPTION_FIELDS) if getattr(params, f) is not None]
        if changed:
            self.check(PromptValues.of(config, params), changed, lambda field: ce.response_param(field, dialect))
