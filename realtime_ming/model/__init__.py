"""Pure PyTorch Ming-flash-omni-2.0 modules, configs and weight loading (no serving concerns).

Entry points: `load_all` (configs + root model + talker + AudioVAE from a checkpoint folder or a
preset), `load_ming` / `build_ming` (root model only), `load_checkpoint_config`, `preset_config`;
`Kernels` / `TRITON` / `REFERENCE` (`model.kernels`): the kernel selection a model is built with.
"""

from .._lazy import lazy_exports

# lazy (PEP 562): the light modules (config, presets) must not load torch, so a bad start fails fast
_WHERE = {
    "CheckpointConfig": ".config",
    "ConfigError": ".config",
    "load_checkpoint_config": ".config",
    "Kernels": ".kernels",
    "REFERENCE": ".kernels",
    "TRITON": ".kernels",
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
__all__, __getattr__, __dir__ = lazy_exports(__name__, _WHERE)
