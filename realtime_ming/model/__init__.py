"""Pure PyTorch Ming-flash-omni-2.0 modules, configs and weight loading (no serving concerns).

Entry points: `load_all` (configs + root model + talker + AudioVAE from a checkpoint folder or a
preset), `load_ming` / `build_ming` (root model only), `load_checkpoint_config`, `preset_config`.
"""

from .config import CheckpointConfig, ConfigError, load_checkpoint_config
from .layers import TPGroup
from .loader import LoadError, checkpoint_keys
from .ming import MingModels, MingOmni, build_ming, load_all, load_ming
from .presets import PRESETS, preset_config

__all__ = [
    "PRESETS",
    "CheckpointConfig",
    "ConfigError",
    "LoadError",
    "MingModels",
    "MingOmni",
    "TPGroup",
    "build_ming",
    "checkpoint_keys",
    "load_all",
    "load_checkpoint_config",
    "load_ming",
    "preset_config",
]
