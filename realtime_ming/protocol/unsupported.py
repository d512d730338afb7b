"""Documented OpenAI fields this server does not implement: refused, never silently ignored.

Each one is accepted only with its empty value (`null`, or `{}`); anything else is validated
for shape and then answered with `unsupported_parameter` naming the field (docs/realtime_api.md,
"Field by field"). Used by `session.update` (GA `session`) and `response.create` (GA `response`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final

from realtime_ming.protocol.dialect import Dialect
from realtime_ming.protocol.error_codes import ErrorCode
from realtime_ming.protocol.errors import ProtocolError
from realtime_ming.protocol.limits import MAX_ECHO_JSON_BYTES
from realtime_ming.protocol.wire import ID, expect_bool, expect_bounded_json, expect_choice, expect_object, expect_str, join

__all__ = ["refuse_parallel_tool_calls", "refuse_prompt", "refuse_reasoning", "refuse_unsupported"]


def _unsupported(param: str, detail: str) -> ProtocolError:
    return ProtocolError(ErrorCode.UNSUPPORTED_PARAMETER, param=param, detail=detail)


def _check_prompt_shape(value: Any, param: str, dialect: Dialect) -> None:
    obj = expect_bounded_json(expect_object(value, param), param, MAX_ECHO_JSON_BYTES)
    ID.decode(obj.get("id"), join(param, "id"), dialect)
    if obj.get("version") is not None:
        ID.decode(obj["version"], join(param, "version"), dialect)
    variables = obj.get("variables")
    if variables is not None:
        for key, item in expect_object(variables, join(param, "variables")).items():
            item_param = join(join(param, "variables"), key)
            if isinstance(item, dict):
                expect_choice(item.get("type"), join(item_param, "type"), ("input_text", "input_image", "input_file"))
            else:
                expect_str(item, item_param)


def refuse_prompt(value: Any, param: str, dialect: Dialect) -> None:
    """`prompt` (a stored prompt template reference): this server stores no prompts."""
    if value is None or value == {}:
        return
    _check_prompt_shape(value, param, dialect)
    raise _unsupported(param, "this server has no stored prompts; send the text as 'instructions'")


def refuse_reasoning(value: Any, param: str, _dialect: Dialect) -> None:
    """`reasoning` (effort of reasoning models): Ming's thinker has no reasoning-effort control."""
    if value is None or value == {}:
        return
    expect_object(value, param)
    raise _unsupported(param, "Ming has no reasoning-effort control; leave it out")


def refuse_parallel_tool_calls(value: Any, param: str, _dialect: Dialect) -> None:
    """`parallel_tool_calls` (GA): several calls in one response are what the server does (each its own
    `function_call` item), so `true` / `null` are honoured; `false` (at most one call) is not enforced."""
    if value is None or expect_bool(value, param):
        return
    raise _unsupported(param, "at most one call per response is not enforced: each call the model writes becomes"
                              " its own function_call item; send true or leave it out")


_REFUSED: Final[dict[str, Callable[[Any, str, Dialect], None]]] = {
    "reasoning": refuse_reasoning, "parallel_tool_calls": refuse_parallel_tool_calls}


def refuse_unsupported(obj: Mapping[str, Any], param: str, dialect: Dialect, *, with_prompt: bool = False) -> None:
    """Raise `unsupported_parameter` for the first documented-but-unimplemented key of `obj` that
    carries a value (`prompt` too when `with_prompt`, where no field table decodes it)."""
    for key, refuse in _REFUSED.items():
        if key in obj:
            refuse(obj[key], join(param, key), dialect)
    if with_prompt and "prompt" in obj:
        refuse_prompt(obj["prompt"], join(param, "prompt"), dialect)
