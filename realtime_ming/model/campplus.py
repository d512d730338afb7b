"""CAMPPlus speaker encoder runner (`talker/campplus.onnx`, 3D-Speaker) on onnxruntime's CPU provider.

Reproduces the speaker branch of docs/model.md §5.4 ([MING] `modeling_bailing_talker.py`
`SpkembExtractor`): mean-normalised kaldi fbank [1, T, 80] (computed by the caller,
`audio.fbank.speaker_fbank`) → 192-d speaker vector [1, 192]. onnxruntime is an optional
dependency, imported only when a runner is built.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

__all__ = ["CampPlusError", "CampPlus", "CAMPPLUS_FILENAME", "FBANK_BINS", "SPEAKER_DIM"]

CAMPPLUS_FILENAME = "campplus.onnx"  # inside the checkpoint's talker/ folder
FBANK_BINS = 80
SPEAKER_DIM = 192


class CampPlusError(RuntimeError):
    """The CAMPPlus model cannot be used: file missing, onnxruntime missing, or unexpected I/O."""


class CampPlus:
    """Run `campplus.onnx`: fbank [1, T, 80] or [T, 80] (float) → speaker vector [1, 192] float32 (CPU).

    Tensor names are read from the session (the reference feeds its first input and reads its
    first output; 3D-Speaker exports name them `feats` / `embs`, which is not relied upon).
    """

    def __init__(self, onnx_path: str | Path, intra_op_threads: int = 2):
        path = Path(onnx_path)
        if not path.is_file():
            raise CampPlusError(
                f"CAMPPlus model not found: {path} (expected talker/{CAMPPLUS_FILENAME} in the checkpoint); "
                "voices can still be registered without a speaker embedding")
        try:
            import onnxruntime
        except ImportError as exc:
            raise CampPlusError(
                "onnxruntime is not installed; it is needed to run the CAMPPlus speaker encoder "
                "(pip install onnxruntime)") from exc
        options = onnxruntime.SessionOptions()
        options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.intra_op_num_threads = intra_op_threads  # per-session pool, not a global setting
        self.session = onnxruntime.InferenceSession(str(path), sess_options=options,
                                                    providers=["CPUExecutionProvider"])
        inputs, outputs = self.session.get_inputs(), self.session.get_outputs()
        if not inputs or not outputs:
            raise CampPlusError(f"{path}: the ONNX graph has no inputs or no outputs")
        self.input_name = inputs[0].name
        self.output_name = outputs[0].name

    def __call__(self, fbank: torch.Tensor | np.ndarray) -> torch.Tensor:
        feats = torch.as_tensor(fbank).detach().to("cpu", torch.float32)
        if feats.dim() == 2:
            feats = feats[None]
        if feats.dim() != 3 or feats.shape[0] != 1 or feats.shape[-1] != FBANK_BINS:
            raise ValueError(f"CAMPPlus expects fbank [1, T, {FBANK_BINS}], got {tuple(feats.shape)}")
        (out,) = self.session.run([self.output_name], {self.input_name: feats.numpy()})
        emb = torch.from_numpy(np.asarray(out, dtype=np.float32)).reshape(1, -1)
        if emb.shape[1] != SPEAKER_DIM:
            raise CampPlusError(f"CAMPPlus returned {emb.shape[1]} values, expected {SPEAKER_DIM}")
        return emb
