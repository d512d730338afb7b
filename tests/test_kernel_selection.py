"""The engine builds every model with the serving kernel selection, explicitly (no process-wide switch):
each module of the thinker, talker and AudioVAE keeps `TRITON`, and tensor-parallel ranks get rank 0's choice."""

from __future__ import annotations

import torch

from realtime_ming.engine.config import EngineConfig
from realtime_ming.engine.models import ModelBundle
from realtime_ming.engine.tp import TPLaunch
from realtime_ming.model.kernels import REFERENCE, TRITON, Kernels
from realtime_ming.model.thinker import Thinker


def _selections(model: torch.nn.Module) -> set:
    return {m.kernels for m in model.modules() if isinstance(getattr(m, "kernels", None), Kernels)}


def test_model_bundle_builds_every_model_with_the_triton_selection():
    bundle = ModelBundle.load(EngineConfig())
    for model in (bundle.thinker, bundle.talker, bundle.vae):
        assert _selections(model) == {TRITON}, type(model).__name__
    # on CPU tensors no Triton kernel applies: the engine's CPU path is the reference math
    assert not bundle.thinker.decode_reads_exact_lengths("cpu")
    assert bundle.thinker.decode_reads_exact_lengths("cuda") == TRITON.on_device("cuda")


def test_a_model_built_without_a_selection_is_the_reference_and_tp_ranks_inherit_rank_0s():
    from realtime_ming.model.presets import tiny_config
    from realtime_ming.model.tiny_tokenizer import TINY_VOCAB_SIZE, tiny_talker_special_ids, tiny_thinker_special_ids

    cfg = tiny_config(tiny_thinker_special_ids(), tiny_talker_special_ids(), TINY_VOCAB_SIZE).thinker
    with torch.device("meta"):
        assert _selections(Thinker(cfg)) == {REFERENCE}
    # a TP launch carries the selection to every worker's `Thinker(..., kernels=launch.kernels)`
    assert TPLaunch.__dataclass_fields__["kernels"].default == TRITON
