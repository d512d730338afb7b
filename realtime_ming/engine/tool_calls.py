"""Incremental parser of Ming's function calls in the thinker's streamed text.

Ming (its checkpoint chat template) calls a function by writing
`<tool_call>\\n{"name": <function-name>, "arguments": <args-json-object>}\\n</tool_call>`; the four tool
markers are special tokens that the thinker runner writes into the text stream verbatim. The parser runs
on the engine thread between the thinker and the segmenter: text outside calls passes through (spoken),
a call never does. It yields, in stream order, plain text and `ToolCallStart` (once the name is known and
is one of the request's tools) / `ToolCallArguments` (argument JSON as it arrives) / `ToolCallEnd`
(`arguments` the JSON object text, or `error` when the call is malformed: not JSON, no object arguments,
an unknown function, or unterminated when the turn ends). A malformed call is never spoken.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterable

from .api import ToolCallArguments, ToolCallEnd, ToolCallStart

__all__ = ["CALL_OPEN", "CALL_CLOSE", "ToolCallParser", "Piece", "tool_names"]

log = logging.getLogger(__name__)

CALL_OPEN = "<tool_call>"
CALL_CLOSE = "</tool_call>"
# the call's head, up to where the arguments start: `{"name": "…", "arguments": `
_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"arguments"\s*:\s*(?=\S)')
_TAIL = re.compile(r"\s*(\}\s*)?$")  # what may still turn out to close the outer object

Piece = str | ToolCallStart | ToolCallArguments | ToolCallEnd


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `tag`."""
    for k in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:k]):
            return k
    return 0


class ToolCallParser:
    """Feed the thinker's text deltas; get text and call events back in order. One per turn."""

    def __init__(self, turn_id: str, names: Iterable[str]):
        self.turn_id = turn_id
        self.names = frozenset(names)
        self._buf = ""
        self._state = "text"  # text | head | args | skip
        self._name = ""
        self._head_text = ""
        self._sent = 0  # characters of the arguments already sent as deltas
        self._stream = True  # False when the arguments are a JSON string: sent whole at the end

    def feed(self, text: str) -> list[Piece]:
        """The pieces `text` completes (text is held back only while it may start a call marker)."""
        self._buf += text
        out: list[Piece] = []
        while True:
            before = (self._state, len(self._buf))
            getattr(self, f"_{self._state}")(out, final=False)
            if (self._state, len(self._buf)) == before:
                return self._offered(out)

    def _offered(self, out: list[Piece]) -> list[Piece]:
        """Without tools offered (tool_choice none, tools not sent yet, the random-weight demo model) a call the
        model writes is cut out of the spoken text and dropped — logged, not an outcome of the response."""
        if self.names:
            return out
        for piece in out:
            if isinstance(piece, ToolCallEnd):
                log.info("turn %s: the model wrote a function call (%s) but the response offers no tools: not spoken",
                         self.turn_id, piece.name or "no name")
        return [piece for piece in out if isinstance(piece, str)]

    def _unknown(self, name: object) -> str:
        return f"unknown function {name!r}"

    def finish(self) -> list[Piece]:
        """End of the turn: release held text; a call still open ends as unterminated."""
        out: list[Piece] = []
        if self._state == "text":
            if self._buf:
                out.append(self._buf)
        elif self._state == "args":
            out.append(ToolCallEnd(self.turn_id, self._name, None, "the call is unterminated (no </tool_call>)"))
        else:
            out.append(ToolCallEnd(self.turn_id, self._name or None, None,
                                   "the call is unterminated (no </tool_call>)"))
        self._buf, self._state = "", "text"
        return self._offered(out)

    # ---- states -----------------------------------------------------------------------------------
    def _text(self, out: list[Piece], final: bool) -> None:
        at = self._buf.find(CALL_OPEN)
        if at >= 0:
            if at:
                out.append(self._buf[:at])
            self._buf, self._state, self._name, self._head_text = self._buf[at + len(CALL_OPEN):], "head", "", ""
            return
        keep = _partial_suffix(self._buf, CALL_OPEN)
        if len(self._buf) > keep:
            out.append(self._buf[: len(self._buf) - keep])
            self._buf = self._buf[len(self._buf) - keep:]

    def _head(self, out: list[Piece], final: bool) -> None:
        close = self._buf.find(CALL_CLOSE)
        m = _HEAD.match(self._buf)
        if m is not None and (close < 0 or m.end() <= close):
            try:
                name = json.loads(f'"{m.group(1)}"')
            except json.JSONDecodeError:
                name = m.group(1)
            if name not in self.names:
                out.append(ToolCallEnd(self.turn_id, name, None, self._unknown(name)))
                self._state = "skip"
                return
            self._name, self._head_text = name, self._buf[: m.end()]
            self._buf, self._state, self._sent = self._buf[m.end():], "args", 0
            self._stream = True
            out.append(ToolCallStart(self.turn_id, name))
        elif close >= 0:  # a call whose head is not in the usual order: judge the whole body
            body, self._buf, self._state = self._buf[:close], self._buf[close + len(CALL_CLOSE):], "text"
            out.extend(self._whole(body))

    def _args(self, out: list[Piece], final: bool) -> None:
        if self._sent == 0 and self._buf.lstrip().startswith('"'):
            self._stream = False
        close = self._buf.find(CALL_CLOSE, max(0, self._sent - len(CALL_CLOSE)))  # only new text can hold it
        if close >= 0:
            raw, self._buf, self._state = self._buf[:close], self._buf[close + len(CALL_CLOSE):], "text"
            out.extend(self._end(raw))
            return
        if not self._stream:
            return
        body = self._buf[: len(self._buf) - _partial_suffix(self._buf, CALL_CLOSE)]
        ready = _TAIL.search(body, self._sent).start() if len(body) > self._sent else self._sent
        if ready > self._sent:
            out.append(ToolCallArguments(self.turn_id, body[self._sent:ready]))
            self._sent = ready

    def _skip(self, out: list[Piece], final: bool) -> None:
        close = self._buf.find(CALL_CLOSE)
        if close >= 0:
            self._buf, self._state = self._buf[close + len(CALL_CLOSE):], "text"
        else:
            self._buf = self._buf[len(self._buf) - _partial_suffix(self._buf, CALL_CLOSE):]

    # ---- judging a complete call ----------------------------------------------------------------------
    def _end(self, raw: str) -> list[Piece]:
        arguments, error = _arguments(self._head_text + raw)
        if error is not None:
            return [ToolCallEnd(self.turn_id, self._name, None, error)]
        out: list[Piece] = []
        if self._stream:
            sent = raw[: self._sent]
            if not arguments.startswith(sent):  # cannot happen for a well-formed object; stay honest
                return [ToolCallEnd(self.turn_id, self._name, None, "the arguments changed while streaming")]
            if len(arguments) > len(sent):
                out.append(ToolCallArguments(self.turn_id, arguments[len(sent):]))
        else:
            out.append(ToolCallArguments(self.turn_id, arguments))
        out.append(ToolCallEnd(self.turn_id, self._name, arguments, None))
        return out

    def _whole(self, body: str) -> list[Piece]:
        try:
            call = json.loads(body)
        except json.JSONDecodeError as exc:
            return [ToolCallEnd(self.turn_id, None, None, f"the call is not JSON: {exc.msg}")]
        name = call.get("name") if isinstance(call, dict) else None
        if not isinstance(name, str) or name not in self.names:
            return [ToolCallEnd(self.turn_id, name if isinstance(name, str) else None, None,
                                self._unknown(name))]
        arguments, error = _arguments(body)
        if error is not None:
            return [ToolCallEnd(self.turn_id, name, None, error)]
        return [ToolCallStart(self.turn_id, name), ToolCallArguments(self.turn_id, arguments),
                ToolCallEnd(self.turn_id, name, arguments, None)]


def _arguments(body: str) -> tuple[str, None] | tuple[None, str]:
    """The call body's arguments as JSON object text (verbatim when the model wrote an object), or an error."""
    try:
        call = json.loads(body)
    except json.JSONDecodeError as exc:
        return None, f"the call is not JSON: {exc.msg}"
    if not isinstance(call, dict) or "arguments" not in call:
        return None, "the call has no arguments"
    args = call["arguments"]
    if isinstance(args, str):  # the template also accepts arguments written as a JSON string
        try:
            decoded = json.loads(args)
        except json.JSONDecodeError:
            return None, "the arguments are not a JSON object"
        return (args, None) if isinstance(decoded, dict) else (None, "the arguments are not a JSON object")
    if not isinstance(args, dict):
        return None, "the arguments are not a JSON object"
    m = _HEAD.match(body)
    if m is not None:  # keep the model's own spelling: the text after the head, less the outer `}`
        verbatim = body[m.end():].rstrip()
        if verbatim.endswith("}"):
            verbatim = verbatim[:-1].rstrip()
            try:
                if json.loads(verbatim) == args:
                    return verbatim, None
            except json.JSONDecodeError:
                pass
    return json.dumps(args, ensure_ascii=False), None


def tool_names(tools) -> list[str]:
    """The function names of a request's tools (chat-completions shape `{"function": {"name"}}` or flat)."""
    names = []
    for tool in tools:
        spec = tool.get("function", tool)
        if isinstance(spec, dict) and isinstance(spec.get("name"), str):
            names.append(spec["name"])
    return names
