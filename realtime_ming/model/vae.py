"""AudioVAE (`talker/vae`): latents [B, N, 64] at 12.5 Hz <-> 44.1 kHz waveform (docs/model.md §6).

Reproduces the official `AudioVAE.AudioVAE` (`Encoder`, `Decoder`, `ISTFTHead`, `ISTFT`) with
the module tree of the checkpoint (strict load, no prefix). The decoder's ISTFT (exp, irfft,
overlap-add, envelope division) always runs in fp32, whatever the module dtype; the streaming
decoder lives in `vae_stream.py` and reuses the helpers below, so stream == full decode.
"""

from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F
from torch import nn

from .config import VAEConfig, VAEDecoderConfig, VAEEncoderConfig
from .kernels.selection import REFERENCE, Kernels
from .qwen2 import Qwen2Model

__all__ = [
    "AudioVAE",
    "VAEEncoder",
    "VAEDecoder",
    "ISTFTHead",
    "ISTFTWindow",
    "Posterior",
    "upsample_linear",
    "overlap_add",
]

_MAG_MAX = 100.0  # ISTFTHead: exp(log-magnitude) is clipped at 1e2
_STD_FLOOR = 1e-4  # diffusers OobleckDiagonalGaussianDistribution: std = softplus(scale) + 1e-4
REFERENCE_AGGREGATOR_LAYERS = 4  # the reference sets config.num_hidden_layers = 4 for the encoder aggregator (VAEEncoder)


def upsample_linear(x: torch.Tensor, left: torch.Tensor, right: torch.Tensor, scale: int) -> torch.Tensor:
    """Linear ×`scale` upsampling in time (`align_corners=False`) with explicit edge frames.

    x [B, N, H]; left/right [B, 1, H] are the frames just before / after x (the sequence's own
    first / last frame at its edges, which is what `F.interpolate` clamps to). Returns
    [B, N·scale, H]; output 4i+r sits at source i + (r + 0.5)/scale − 0.5 (docs/model.md §6.2,
    §6.4: with neighbours from the previous / next chunk a chunk upsamples exactly as inside
    the whole sequence).
    """
    ext = torch.cat((left, x, right), dim=1)
    prev, cur, nxt = ext[:, :-2], ext[:, 1:-1], ext[:, 2:]
    outs = []
    for r in range(scale):
        d = (r + 0.5) / scale - 0.5
        outs.append(-d * prev + (1 + d) * cur if d < 0 else (1 - d) * cur + d * nxt)
    b, n, h = x.shape
    return torch.stack(outs, dim=2).reshape(b, n * scale, h)


def overlap_add(frames: torch.Tensor, hop: int) -> torch.Tensor:
    """Sum frames [B, T, win] placed every `hop` samples -> [B, (T-1)·hop + win] (fold)."""
    b, t, win = frames.shape
    out = F.fold(frames.transpose(1, 2), output_size=(1, (t - 1) * hop + win), kernel_size=(1, win),
                 stride=(1, hop))
    return out[:, 0, 0, :]


class ISTFTWindow(nn.Module):
    """`decoder.head.istft`: holds the periodic Hann window (persistent buffer, in the checkpoint)."""

    def __init__(self, n_fft: int):
        super().__init__()
        self.n_fft = n_fft
        self.register_buffer("window", torch.hann_window(n_fft, periodic=True))

    def init_buffers(self) -> None:
        w = torch.hann_window(self.n_fft, periodic=True, device=self.window.device)
        self.window = w.to(self.window.dtype)


class ISTFTHead(nn.Module):
    """`ISTFTHead` ("same" padding): hidden -> log-magnitude | phase -> windowed irfft frames.

    Only the framewise part lives here; overlap-add and trimming differ between the full and the
    streaming decode and are done by the callers.
    """

    def __init__(self, hidden: int, n_fft: int, hop: int):
        super().__init__()
        self.n_fft, self.hop = n_fft, hop
        self.out = nn.Linear(hidden, n_fft + 2)
        self.istft = ISTFTWindow(n_fft)

    @property
    def trim(self) -> int:
        """Samples dropped at each end of the stream ('same' padding): (win − hop) / 2."""
        return (self.n_fft - self.hop) // 2

    def window_sq(self) -> torch.Tensor:
        return self.istft.window.float().square()  # [win] fp32

    def frames(self, h: torch.Tensor) -> torch.Tensor:
        """h [B, T, hidden] -> windowed time-domain frames [B, T, n_fft] fp32 (mag clipped at 100)."""
        logmag, phase = self.out(h).float().chunk(2, dim=-1)  # [B, T, n_fft/2 + 1] each
        mag = logmag.exp().clamp(max=_MAG_MAX)
        spec = torch.complex(mag * phase.cos(), mag * phase.sin())
        return torch.fft.irfft(spec, n=self.n_fft, dim=-1) * self.istft.window.float()


class VAEDecoder(nn.Module):
    """`Decoder`: fc1 -> linear ×patch upsampling -> causal sliding-window Qwen2 -> ISTFT head (§6.2)."""

    def __init__(self, cfg: VAEDecoderConfig, patch_size: int, *, kernels: Kernels = REFERENCE):
        super().__init__()
        bb = cfg.backbone
        self.patch_size = patch_size
        self.fc1 = nn.Linear(cfg.latent_dim, bb.hidden_size)
        self.decoder = Qwen2Model(bb, kernels=kernels)
        self.head = ISTFTHead(bb.hidden_size, n_fft=4 * cfg.output_dim, hop=cfg.output_dim)

    def forward(self, latents: torch.Tensor) -> torch.Tensor:
        """Full decode: latents [B, N, latent] -> waveform [B, N·patch·hop] fp32."""
        x = self.fc1(latents)
        x = upsample_linear(x, x[:, :1], x[:, -1:], self.patch_size)  # [B, 4N, H]
        b, t, _ = x.shape
        pos = torch.arange(t, device=x.device).expand(b, t)
        frames = self.head.frames(self.decoder(x, pos))  # [B, 4N, win] fp32
        y = overlap_add(frames, self.head.hop)
        env = overlap_add(self.head.window_sq().expand(1, t, -1), self.head.hop)
        trim = self.head.trim
        return (y / env)[:, trim:y.shape[1] - trim]


class VAEEncoder(nn.Module):
    """`Encoder`: 882-sample frames -> fc1 -> fc2 -> Qwen2 -> [4 frames + CLS]* -> 4-layer Qwen2 -> fc3 (§6.3).

    The aggregator runs over the whole interleaved sequence (frames and CLS tokens, positions
    0..5G−1) with the backbone's causal sliding window, as the reference does; only the CLS outputs
    are kept. `norm` exists in the checkpoint but is unused by the reference.

    Layer rule of the reference (`AudioVAE` `Encoder.__init__`): it builds `encoder = Qwen2Model(config)`
    with the backbone config, then sets `config.num_hidden_layers = 4` on that SAME config object and
    builds `aggregator = Qwen2Model(config)`. HF's `Qwen2Model.forward` runs
    `self.layers[: self.config.num_hidden_layers]`, so after the change the encoder backbone runs only
    its first `min(num_hidden_layers, 4)` layers although it holds (and loads) `num_hidden_layers`;
    the aggregator holds and runs 4. (The sliding-window type of each layer is fixed at construction
    from the original count, so layer i keeps `layer_window(i)` of the backbone config.)
    """

    def __init__(self, cfg: VAEEncoderConfig, patch_size: int, *, kernels: Kernels = REFERENCE):
        super().__init__()
        bb = cfg.backbone
        h = bb.hidden_size
        self.input_dim, self.hop, self.patch_size = cfg.input_dim, cfg.hop_size, patch_size
        self.fc1 = nn.Linear(cfg.input_dim, h, bias=False)
        self.fc2 = nn.Linear(h, h)
        self.encoder = Qwen2Model(bb, run_layers=min(bb.num_hidden_layers, REFERENCE_AGGREGATOR_LAYERS),
                                  kernels=kernels)
        self.aggregator = Qwen2Model(dataclasses.replace(bb, num_hidden_layers=REFERENCE_AGGREGATOR_LAYERS),
                                     kernels=kernels)
        self.cls_embed = nn.Parameter(torch.empty(1, 1, h))
        self.fc3 = nn.Linear(h, 2 * cfg.latent_dim)
        self.norm = nn.LayerNorm(h)

    def forward(self, wave: torch.Tensor) -> torch.Tensor:
        """wave [B, L] -> posterior parameters [B, ceil(ceil(L/hop)/patch), 2·latent] ([mean | scale])."""
        num_frames = -(-wave.shape[-1] // self.hop)
        need = (num_frames - 1) * self.hop + self.input_dim
        frames = F.pad(wave, (0, need - wave.shape[-1])).unfold(-1, self.input_dim, self.hop)  # [B, T, in]
        x = self.fc2(self.fc1(frames))
        b, t, h = x.shape
        x = self.encoder(x, torch.arange(t, device=x.device).expand(b, t))
        groups = -(-t // self.patch_size)
        x = F.pad(x, (0, 0, 0, groups * self.patch_size - t)).reshape(b, groups, self.patch_size, h)
        x = torch.cat((x, self.cls_embed.expand(b, groups, 1, h)), dim=2).reshape(b, -1, h)
        s = x.shape[1]
        x = self.aggregator(x, torch.arange(s, device=x.device).expand(b, s))
        cls = x.reshape(b, groups, self.patch_size + 1, h)[:, :, -1]  # [B, G, H]
        return self.fc3(cls)


@dataclasses.dataclass
class Posterior:
    """Diagonal Gaussian over latents (diffusers `OobleckDiagonalGaussianDistribution`): [B, N, latent] each."""

    mean: torch.Tensor
    std: torch.Tensor

    def sample(self, eps: torch.Tensor | None = None, generator: torch.Generator | None = None) -> torch.Tensor:
        """mean + std·eps; eps ~ N(0, 1) drawn with `generator` when not given (the reference samples)."""
        if eps is None:
            eps = torch.randn(self.mean.shape, generator=generator, device=self.mean.device, dtype=self.mean.dtype)
        return self.mean + self.std * eps.to(self.mean.dtype)


class AudioVAE(nn.Module):
    """Root of `talker/vae/model.safetensors` (keys `encoder.*`, `decoder.*`, no prefix); `kernels` (default:
    the reference PyTorch ops) selects the Triton kernels its Qwen2 backbones run."""

    def __init__(self, cfg: VAEConfig, *, kernels: Kernels = REFERENCE):
        super().__init__()
        self.cfg, self.kernels = cfg, kernels
        self.encoder = VAEEncoder(cfg.enc_kwargs, cfg.patch_size, kernels=kernels)
        self.decoder = VAEDecoder(cfg.dec_kwargs, cfg.patch_size, kernels=kernels)

    @property
    def samples_per_latent(self) -> int:
        return self.cfg.dec_kwargs.output_dim * self.cfg.patch_size

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """latents [B, N, latent] -> waveform [B, N·patch·hop] fp32 at 44.1 kHz (`vae.decode(use_cache=False)`)."""
        return self.decoder(latents.to(self.decoder.fc1.weight.dtype))

    def encode(self, wave: torch.Tensor) -> Posterior:
        """wave [B, L] -> posterior with mean/std [B, ceil(ceil(L/hop)/patch), latent] (model dtype).

        The split and softplus run in fp32 and are cast back, so bf16 differs from the reference
        (all-bf16) only by rounding.
        """
        params = self.encoder(wave.to(self.encoder.fc1.weight.dtype))
        mean, scale = params.float().chunk(2, dim=-1)
        std = F.softplus(scale) + _STD_FLOOR
        return Posterior(mean.to(params.dtype), std.to(params.dtype))

    def prompt_wave(self, wave: torch.Tensor, talker_patch_size: int) -> torch.Tensor:
        """Voice-prompt preprocessing of `register_prompt_wav` (§5.4): [B, L] 44.1 kHz -> [B, L'] fp32.

        Left-pads with zeros to a multiple of hop·vae_patch·talker_patch (14112) samples and rounds
        through bfloat16, which the reference does before encoding even in an fp32 run.
        """
        unit = self.samples_per_latent * talker_patch_size
        padded = F.pad(wave.float(), (math.ceil(wave.shape[-1] / unit) * unit - wave.shape[-1], 0))
        return padded.to(torch.bfloat16).float()

    def encode_prompt(self, wave: torch.Tensor, talker_patch_size: int, eps: torch.Tensor | None = None,
                      generator: torch.Generator | None = None) -> tuple[Posterior, torch.Tensor]:
        """Voice-prompt latents (§5.4 latent branch): (posterior, sampled latents [B, N, latent]), N % talker_patch == 0."""
        posterior = self.encode(self.prompt_wave(wave, talker_patch_size))
        return posterior, posterior.sample(eps, generator)
