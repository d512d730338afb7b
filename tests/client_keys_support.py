"""The key tree of the openai package's client events, which `protocol/known_keys.py` reads from a committed copy.

`key_tree(dialect)` walks the pydantic models of `openai.types.realtime.RealtimeClientEvent` (GA) or
`openai.types.beta.realtime.RealtimeClientEvent` (beta): every object's keys, arrays' items, and unions of
objects split by their `type` literal (objects of one `type` merged, e.g. the three GA message roles).
Free-form values (`Dict[str, ...]`, `object`) are leaves `{}`. Regenerate the committed copy after an
openai upgrade with `python3 tests/client_keys_support.py` (test_protocol_strict_keys compares them).
"""

from __future__ import annotations

import json
import sys
import types
import typing
from pathlib import Path
from typing import Any

import openai
from openai.types.beta.realtime import RealtimeClientEvent as BetaClientEvent
from openai.types.realtime import RealtimeClientEvent as GaClientEvent
from openai.types.realtime.response_item_reference import ResponseItemReference
from pydantic import BaseModel

from realtime_ming.protocol.known_keys import merge_key_trees

__all__ = ["ASSET", "generate", "key_tree"]

ASSET = Path(__file__).resolve().parent.parent / "realtime_ming" / "assets" / "openai_client_keys.json"
_ROOTS = {"ga": GaClientEvent, "beta": BetaClientEvent}


def _type_literal(model: type[BaseModel]) -> str | None:
    field = model.model_fields.get("type")
    if field is None or typing.get_origin(field.annotation) is not typing.Literal:
        return None
    values = typing.get_args(field.annotation)
    return values[0] if len(values) == 1 else None


def _union(members: tuple[Any, ...], seen: frozenset[type]) -> dict[str, Any]:
    models = [m for m in members if isinstance(m, type) and issubclass(m, BaseModel)]
    node: dict[str, Any] = {}
    for other in (m for m in members if m not in models):
        node = merge_key_trees(node, _node(other, seen))
    tags = [_type_literal(m) for m in models]
    if models and all(tags):
        variants: dict[str, Any] = {}
        for tag, model in zip(tags, models, strict=True):
            sub = _node(model, seen)
            variants[tag] = merge_key_trees(variants[tag], sub) if tag in variants else sub
        return merge_key_trees(node, {"variants": variants})
    for model in models:
        node = merge_key_trees(node, _node(model, seen))
    return node


def _node(annotation: Any, seen: frozenset[type] = frozenset()) -> dict[str, Any]:
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _node(typing.get_args(annotation)[0], seen)
    if origin in (typing.Union, types.UnionType):
        return _union(typing.get_args(annotation), seen)
    if origin in (list, tuple, typing.Iterable) or (origin is not None and getattr(origin, "__name__", "") in (
            "Iterable", "Sequence", "List")):
        return {"items": _node(typing.get_args(annotation)[0], seen)}
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        if annotation in seen:
            return {}
        keys = {(f.alias or name): _node(f.annotation, seen | {annotation})
                for name, f in annotation.model_fields.items()}
        return {"keys": keys}
    return {}  # scalars, literals, Dict[str, ...], object: no key checks


def key_tree(dialect: str) -> dict[str, Any]:
    """The tree of every client event of `dialect` (`"ga"` or `"beta"`): variants by event `type`. GA
    `response.create` `input` also takes `item_reference`s (typed by openai only as `ResponseItemReference`)."""
    tree = _node(_ROOTS[dialect])
    if dialect == "ga":
        reference = {"variants": {"item_reference": _node(ResponseItemReference)}}
        tree = merge_key_trees(tree, {"variants": {"response.create": {"keys": {"response": {"keys": {
            "input": {"items": reference}}}}}}})
    return tree


def generate() -> dict[str, Any]:
    """The committed asset's content for the installed openai package."""
    return {"openai_version": openai.__version__, **{dialect: key_tree(dialect) for dialect in _ROOTS}}


if __name__ == "__main__":
    ASSET.write_text(json.dumps(generate(), indent=1, sort_keys=True) + "\n")
    sys.stdout.write(f"wrote {ASSET} from openai {openai.__version__}\n")
