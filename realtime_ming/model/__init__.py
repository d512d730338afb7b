"""Pure PyTorch Ming-flash-omni-2.0 modules, configs and weight loading (no serving concerns).

Entry points: `load_all` (configs + root model + talker + AudioVAE from a checkpoint folder or a
preset), `load_ming` / `build_ming` (root model only), `load_checkpoint_config`, `preset_config`.
"""

import importlib

# lazy (PEP 562): the light modules (config, presets) must not load torch, so a bad start fails fast
_WHERE = {
    "CheckpointConfig": ".config",
    "ConfigError": ".config",
    "load_checkpoint_config": ".config",
    "TPGroup": ".layers",
    "LoadError": ".loader",
    "checkpoint_keys": ".loader",
    "MingModels": ".ming",
    "MingOmni": ".ming",
    "build_ming": ".ming",
    "load_all": ".ming",
    "load_ming": ".ming",
    "PRESETS": ".presets",
    "preset_config": ".presets",
}
__all__ = sorted(_WHERE)


def __getattr__(name: str):
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module, __name__), name)


def __dir__() -> list[str]:
    return __all__
