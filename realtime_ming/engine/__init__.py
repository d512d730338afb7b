"""Engine stage: thinker runner, segmenter, talker runner, streaming VAE, the engine thread and its queues."""

from .engine import Engine, EngineStats

__all__ = ["Engine", "EngineStats"]
