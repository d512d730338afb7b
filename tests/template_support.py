"""The checkpoint's own chat template (tokenizer_config.json) rendered as transformers renders it: the outside
truth that prompt tests compare our token-level prompt builder with. Nothing here is a test."""

from __future__ import annotations

import json

import jinja2
import jinja2.sandbox

from realtime_ming.model.tokenizer import MING_TOKENIZER_DIR

__all__ = ["chat_template"]


def chat_template() -> jinja2.Template:
    """The checkpoint's chat template in the environment transformers renders it with (tojson = json.dumps,
    ensure_ascii False, keys unsorted; trim_blocks / lstrip_blocks)."""
    config = json.loads((MING_TOKENIZER_DIR / "tokenizer_config.json").read_text(encoding="utf-8"))
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                      extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = lambda x, **_: json.dumps(x, ensure_ascii=False)
    return env.from_string(config["chat_template"])
