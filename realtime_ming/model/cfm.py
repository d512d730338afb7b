"""CFM sampler of the talker: swayed Euler integration with classifier-free guidance.

Reproduces docs/model.md §5.6 ([MING] `talker_module/cfm.py`: `CFM.sample`,
`get_epss_timesteps`). Noise is an explicit input (y0, per-step SDE noise) so runs are
reproducible and the whole sampler is one static-shape, host-sync-free function (CUDA-graphable).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from .kernels.cfm_step import cfm_step
from .dit import DiT

__all__ = ["EPSS_TIMESTEPS", "SWAY_COEF", "CFMParams", "epss_time_grid", "sway", "sway_time_grid", "CFM"]

# `get_epss_timesteps`: predefined grids in units of 1/32; other step counts use linspace(0, 1).
EPSS_TIMESTEPS = {
    5: (0, 2, 4, 8, 16, 32),
    6: (0, 2, 4, 6, 8, 16, 32),
    7: (0, 2, 4, 6, 8, 16, 24, 32),
    10: (0, 2, 4, 6, 8, 12, 16, 20, 24, 28, 32),
    12: (0, 2, 4, 6, 8, 10, 12, 14, 16, 20, 24, 28, 32),
    16: (0, 1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16, 20, 24, 28, 32),
}
SWAY_COEF = -1.0


@dataclass(frozen=True, slots=True)
class CFMParams:
    """Sampler call arguments (reference defaults): CFG strength, SDE sigma, temperature."""

    cfg_strength: float = 2.0
    sigma: float = 0.25
    temperature: float = 0.0

    def __post_init__(self):
        if self.sigma < 0 or self.temperature < 0:
            raise ValueError("sigma and temperature must be >= 0")

    def tensor(self, device=None, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The `sde_args` row [3] = (cfg, sigma, temperature), in the activation dtype as the reference."""
        return torch.tensor([self.cfg_strength, self.sigma, self.temperature], device=device, dtype=dtype)


def epss_time_grid(steps: int, dtype: torch.dtype = torch.float32, device=None) -> torch.Tensor:
    """Raw time grid [steps + 1] in `dtype` (before the sway)."""
    ticks = EPSS_TIMESTEPS.get(steps)
    if ticks is None:
        return torch.linspace(0, 1, steps + 1, device=device, dtype=dtype)
    return (1 / 32) * torch.tensor(ticks, device=device, dtype=dtype)


def sway(t: torch.Tensor, coef: float = SWAY_COEF) -> torch.Tensor:
    """t + coef·(cos(πt/2) − 1 + t), evaluated in t's dtype (bf16 in production)."""
    return t + coef * (torch.cos(math.pi / 2 * t) - 1 + t)


def sway_time_grid(steps: int, dtype: torch.dtype = torch.float32, device=None) -> torch.Tensor:
    """The swayed grid the sampler integrates on; compute once per dtype and reuse.

    Production creates it in the activation dtype (bf16): 0, 0.00390625, ..., 1; fp32 gives
    0, 0.004815, ..., 1 (fixtures `t_grid_bf16_after_sway` / `t_grid_fp32_after_sway`).
    """
    return sway(epss_time_grid(steps, dtype, device))


def _per_row(v: torch.Tensor) -> torch.Tensor:
    """A [] / [1] / [B] argument broadcastable against [B, P, C]."""
    return v.reshape(-1, 1, 1)


class CFM(nn.Module):
    """Holds the velocity network as `model` (checkpoint keys `cfm.model.*`)."""

    def __init__(self, model: DiT):
        super().__init__()
        self.model = model

    def sample(self, cond: torch.Tensor, history: torch.Tensor, y0: torch.Tensor, t: torch.Tensor,
               sde_args: torch.Tensor, sde_rnd: torch.Tensor, trajectory: bool = False):
        """Integrate from noise y0 to a latent patch.

        cond [B, 1, H] LM hidden; history [B, Hh, C]; y0 [B, P, C]; t [S+1] the SWAYED grid
        (`sway_time_grid`); sde_args [3] or [B, 3] = (cfg strength, sigma, temperature) per row;
        sde_rnd [S, B, P, C]. Each step: y += v(y, t_i)·dt, then
        y += sigma·sqrt(temperature)·sqrt(|dt|)·sde_rnd[i]. Returns y [B, P, C], or
        (y, states [S+1, B, P, C]) with `trajectory=True`.
        """
        cfg_strength, sigma, temperature = sde_args.unbind(-1)
        noise_scale = _per_row(sigma) * _per_row(temperature) ** 0.5
        y = y0
        states = [y0]
        steps = t.shape[0] - 1
        # the step times, condition and history are embedded once for the whole run
        ctx = self.model.cfg_context(cond, history, t[:steps])
        cfg = _per_row(cfg_strength)
        for i in range(steps):
            # y += v·dt with v = v_c + (v_c − v_u)·cfg, then the SDE noise: one kernel on CUDA
            y = cfm_step(y, self.model.forward_with_cfg(y, i, ctx), t[i + 1] - t[i], cfg, noise_scale, sde_rnd[i],
                         kernels=self.model.kernels)
            if trajectory:
                states.append(y)
        return (y, torch.stack(states)) if trajectory else y
