"""AudioVAE test helpers: the fixture's VAE and a streaming decode of latents."""

from __future__ import annotations

import torch

from realtime_ming.model.config import load_checkpoint_config
from realtime_ming.model.loader import load_weights, read_weight_map
from realtime_ming.model.vae import AudioVAE
from realtime_ming.model.vae_stream import VAEStreamState, decode_chunk


def _load_vae(root, dtype=torch.float32) -> AudioVAE:
    cfg = load_checkpoint_config(root)
    with torch.device("meta"):
        vae = AudioVAE(cfg.vae)
    return load_weights(vae, read_weight_map(root / "talker" / "vae" / "model.safetensors"), dtype=dtype).eval()


def _stream(vae, latents, patch, lengths=None):
    """Decode [1, N, D] latents alone in chunks of `patch`; returns (concatenated audio, chunk lengths)."""
    num = latents.shape[1] // patch
    state = VAEStreamState.allocate(vae, 1, patch)
    outs = []
    for i in range(num):
        outs += decode_chunk(vae, latents[:, i * patch:(i + 1) * patch], state, i == num - 1).rows()
    return torch.cat(outs), [o.numel() for o in outs]
