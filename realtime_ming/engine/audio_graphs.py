"""The audio encoder + projector of a turn's clip, CUDA-graphed per clip-length bucket.

Eager, the Whisper encoder is ~700 small launches per clip (32 blocks at real shapes): host-bound,
13-36 ms on an H200 and slower still in a process that also drives NCCL, against well under 2 ms
of GPU work for a few seconds of speech. Here each clip is zero-padded to the smallest bucket of
mel frames that holds it and run through one captured graph; `WhisperEncoder(mel, mel_lengths)`
masks the padding (zeroed before each conv, out of attention, zero into the projector), so a
clip's embeddings are its exact-length ones within rounding. Clips longer than the largest bucket,
CPU, and `enforce_eager` take the eager exact-length path.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..model.audio_encoder import AudioProjector, WhisperEncoder, audio_token_lengths
from ..model.config import AudioEncoderConfig
from .graphs import BucketedGraph, GraphInput, upload

__all__ = ["CLIP_BUCKETS", "AudioEncoderGraphs"]

CLIP_BUCKETS = (160, 320, 640, 1280, 3000)  # CUDA-graph clip lengths, mel frames (100 per second); longer: eager


class AudioEncoderGraphs:
    """mel [T, n_mels] → projected, unit-norm audio embeddings [tokens, hidden] on `out_device`."""

    def __init__(self, encoder: WhisperEncoder, projector: AudioProjector, cfg: AudioEncoderConfig,
                 buckets: Sequence[int], *, dtype: torch.dtype, device: torch.device | str,
                 out_device: torch.device | str, enforce_eager: bool = False):
        self.encoder, self.projector, self.cfg = encoder, projector, cfg
        self.dtype, self.device, self.out_device = dtype, torch.device(device), torch.device(out_device)
        limit = 2 * encoder.n_ctx  # mel frames whose encoder output fits n_ctx positions
        buckets = sorted({min(int(b), limit) for b in buckets if int(b) > 0})
        self.graph = None
        if buckets and not enforce_eager and self.device.type == "cuda":
            n_mels = encoder.conv1.in_channels
            specs = {"mel": GraphInput((1, max(buckets), n_mels), dtype, batch_dim=1, pad=0),
                     "mel_lengths": GraphInput((1,), torch.int64, batch_dim=None)}
            self.graph = BucketedGraph(self._fn, specs, buckets, device=self.device, output_batch_dims=None)

    @property
    def graphed(self) -> bool:
        return self.graph is not None and self.graph.graphed

    def _fn(self, mel: torch.Tensor, mel_lengths: torch.Tensor) -> torch.Tensor:
        return self.projector(self.encoder(mel, mel_lengths))

    def capture(self, progress=None) -> None:
        if self.graph is not None:
            if progress is not None:
                progress("capturing audio encoder graphs", 0, len(self.graph.buckets))
            self.graph.capture()
            if progress is not None:
                progress("capturing audio encoder graphs", len(self.graph.buckets), len(self.graph.buckets))

    @torch.no_grad()
    def __call__(self, mel: torch.Tensor, graphed: bool = True) -> torch.Tensor:
        """mel [T, n_mels] (on the encoder's device, or the CPU) → [tokens, hidden]. No host sync: a host mel
        goes up from pinned memory."""
        frames = mel.shape[0]
        tokens = int(audio_token_lengths(frames, self.cfg))
        if self.device.type == "cuda" and not mel.is_cuda:
            mel = mel.pin_memory()
        mel = mel.to(self.device, non_blocking=True)[None].to(self.dtype)
        if not (graphed and self.graphed) or frames > max(self.graph.buckets):
            return self.projector(self.encoder(mel))[0].to(self.out_device)
        lengths = upload([frames], torch.int64, self.device)
        out = self.graph.step(mel=mel, mel_lengths=lengths)  # [1, bucket tokens, hidden], graph memory
        return out[0, :tokens].to(self.out_device, copy=True)
