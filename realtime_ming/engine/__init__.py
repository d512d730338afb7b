"""Engine stage: thinker runner, segmenter, talker runner, streaming VAE, the engine thread and its queues."""

__all__ = ["Engine", "EngineStats"]


def __getattr__(name: str):
    # lazy: importing a submodule (engine.api, engine.graphs) must not load every model module
    if name in __all__:
        from . import engine

        return getattr(engine, name)
    raise AttributeError(name)
