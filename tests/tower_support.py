"""What the encoder-tower tests (vision, audio) share: one tower and its projector built on the fixture
checkpoint's weights, and the tolerances of their golden comparisons."""

from __future__ import annotations

import torch

from realtime_ming.model.config import load_checkpoint_config
from realtime_ming.model.loader import load_weights, read_weight_map

EMBED_TOL = dict(rtol=1e-4, atol=1e-5)
HIDDEN_TOL = dict(rtol=1e-4, atol=1e-4)


def load_tower(root, tower_cls, projector_cls, config: str, tower_prefix: str, projector_prefix: str,
               dtype=torch.float32):
    """(MingConfig, tower, projector): `tower_cls(cfg.<config>)` and `projector_cls(cfg.<config>, hidden)`
    loaded from the checkpoint at `root` under their prefixes."""
    cfg = load_checkpoint_config(root).ming
    tower_cfg = getattr(cfg, config)
    weights = read_weight_map(root)
    with torch.device("meta"):
        tower = tower_cls(tower_cfg)
        projector = projector_cls(tower_cfg, cfg.llm_config.hidden_size)
    load_weights(tower, weights, prefix=tower_prefix, dtype=dtype)
    load_weights(projector, weights, prefix=projector_prefix, dtype=dtype)
    return cfg, tower, projector
