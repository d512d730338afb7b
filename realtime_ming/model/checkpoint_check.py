"""What a server checks of the model before it loads it: the one entry point of `server/` into `model/`.

`check_checkpoint` reads a checkpoint folder's config, its weight indexes and its thinker tokenizer without
loading a weight; `checkpoint_voices` names the voices a checkpoint (or a preset) speaks; `is_load_error` tells
the failures a load can meet on a valid config (a mismatched or unreadable checkpoint) from bugs. Light: only
the config, loader-index and tokenizer-resolution modules are imported (no torch until a load).
"""

from __future__ import annotations

from pathlib import Path

from .config import CheckpointConfig

__all__ = ["CheckpointProblem", "check_checkpoint", "checkpoint_voices", "is_load_error"]

# the weight files whose indexes a checkpoint must have, relative to its folder
_WEIGHT_FILES = (".", "talker/model.safetensors", "talker/vae/model.safetensors")


class CheckpointProblem(Exception):
    """A checkpoint folder that cannot serve. `incomplete`: a file or the config is missing or broken (the folder is
    not a whole checkpoint); otherwise the message says what to pass instead (a tokenizer). `cause` is the error."""

    def __init__(self, cause: Exception, *, incomplete: bool) -> None:
        super().__init__(str(cause))
        self.cause = cause
        self.incomplete = incomplete


def check_checkpoint(folder: Path, *, weights: bool, tokenizer_path: str | None) -> CheckpointConfig:
    """The parsed config of checkpoint `folder` after checking its weight indexes (`weights`: the checkpoint's own
    weights will be loaded) and that its thinker tokenizer resolves (`tokenizer_path` overrides where it is).
    Raises CheckpointProblem."""
    from .config import ConfigError, load_checkpoint_config
    from .loader import LoadError, read_weight_map
    from .tokenizer import TokenizerNotFoundError, resolve_tokenizer

    try:
        checkpoint = load_checkpoint_config(folder)
    except ConfigError as exc:
        raise CheckpointProblem(exc, incomplete=True) from exc
    if weights:
        for where in _WEIGHT_FILES:
            try:
                read_weight_map(folder / where)
            except LoadError as exc:
                raise CheckpointProblem(exc, incomplete=True) from exc
    try:
        resolve_tokenizer(folder, tokenizer_path)
    except (TokenizerNotFoundError, ValueError) as exc:
        raise CheckpointProblem(exc, incomplete=False) from exc
    return checkpoint


def checkpoint_voices(checkpoint: CheckpointConfig | None, preset: str | None) -> list[str]:
    """The voices of `checkpoint`, or without one of `preset` (None or "tiny": the embedded demo model).
    Raises ValueError for an unknown preset."""
    from .presets import preset_config

    if checkpoint is None and preset in (None, "tiny"):
        from .tiny_tokenizer import TINY_VOCAB_SIZE, tiny_talker_special_ids, tiny_thinker_special_ids

        checkpoint = preset_config("tiny", thinker_ids=tiny_thinker_special_ids(),
                                   talker_ids=tiny_talker_special_ids(), vocab=TINY_VOCAB_SIZE)
    elif checkpoint is None:
        checkpoint = preset_config(preset)
    return list(checkpoint.voices)


def is_load_error(exc: BaseException) -> bool:
    """`exc` is a failure a model load can meet on a valid config (a checkpoint that does not match, a missing
    tokenizer, an unusable speaker encoder), not a bug."""
    from .campplus import CampPlusError
    from .config import ConfigError
    from .loader import LoadError
    from .tokenizer import TokenizerNotFoundError

    return isinstance(exc, (LoadError, ConfigError, TokenizerNotFoundError, CampPlusError))
