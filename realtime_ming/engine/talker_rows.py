"""A talker replica's static per-stream state, one row per running stream: the talker's (LM cache, latent history,
hidden state for the next tail step, aggregator output) on its device and the streaming AudioVAE's
(`VAEStreamState`) on the VAE's. Allocated once for `engine.talker.max_streams` rows; the runner keeps its
streams in rows 0..n-1 and moves rows as streams end (compaction), park (`copy`) and come back (`put`).

Every write to the VAE's part runs on the VAE's CUDA stream (`TalkerStreams.vae`), the talker's part on the caller's
(the talker stream): the two never touch each other's state (`engine/talker_sync.py`).
"""

from __future__ import annotations

import torch

from ..model.qwen2 import KVCache
from ..model.vae_stream import VAEStreamState
from .graphs import upload
from .talker_sync import TalkerStreams

__all__ = ["RowState", "TalkerRows"]

RowState = tuple[list[torch.Tensor], list[torch.Tensor]]  # one row's (talker, VAE) tensors


class TalkerRows:
    """The rows of one replica: `cache`, `his` [B, history, C], `h` and `next_embed` [B, 1, hidden], `vae_state`."""

    def __init__(self, talker, vae, tcfg, rows: int, max_prompt_len: int, gpu: TalkerStreams, *,
                 device: torch.device, vae_device: torch.device, dtype: torch.dtype):
        hid, lat = talker.hidden_size, talker.latent_dim
        self._gpu = gpu
        self.vae_device = vae_device
        self.cache = KVCache.allocate(tcfg.llm, rows, max_prompt_len, device, dtype)
        self.his = torch.zeros(rows, tcfg.history_patch_size, lat, device=device, dtype=dtype)
        self.h = torch.zeros(rows, 1, hid, device=device, dtype=dtype)  # LM hidden for the next tail step
        self.next_embed = torch.zeros(rows, 1, hid, device=device, dtype=dtype)  # aggregator output
        self.vae_state = VAEStreamState.allocate(vae, rows, chunk_latents=tcfg.patch_size)

    def reset_vae(self, start: int, stop: int) -> None:
        """Start the VAE state of rows [start, stop) afresh (a new stream, or rows left empty), on the VAE's stream."""
        if start < stop:
            with self._gpu.vae():
                self.vae_state.reset_range(start, stop)

    def _talker_state(self) -> list[tuple[torch.Tensor, int]]:
        """The talker's per-stream state tensors, each with its row dim (LM cache, history, h, aggregator output)."""
        c = self.cache
        return [(c.k, 1), (c.v, 1), (c.slot_pos, 0), (self.his, 0), (self.h, 0), (self.next_embed, 0)]

    def _vae_state(self) -> list[tuple[torch.Tensor, int]]:
        """The VAE's per-stream state tensors, each with its row dim (written on the VAE's stream only)."""
        st = self.vae_state
        return [(st.cache.k, 1), (st.cache.v, 1), (st.cache.slot_pos, 0)] + [
            (t, 0) for t in (st.held, st.left_ctx, st.has_held, st.frame_pos, st.audio_buf, st.env_buf)]

    def talker_views(self, row: int) -> list[torch.Tensor]:
        """Views of the talker's per-stream state at `row`."""
        return [t.select(dim, row) for t, dim in self._talker_state()]

    def vae_views(self, row: int) -> list[torch.Tensor]:
        """Views of the VAE's per-stream state at `row`."""
        return [t.select(dim, row) for t, dim in self._vae_state()]

    def copy(self, row: int) -> RowState:
        """A copy of every per-stream state tensor at `row`: (the talker's, the VAE's)."""
        talker = [t.clone() for t in self.talker_views(row)]
        with self._gpu.vae():
            return talker, [t.clone() for t in self.vae_views(row)]

    def put(self, row: int, state: RowState) -> None:
        """Write `state` (`copy`, or another row's views) into `row`, each part on its own stream."""
        for d, s in zip(self.talker_views(row), state[0]):
            d.copy_(s)
        with self._gpu.vae():
            for d, s in zip(self.vae_views(row), state[1]):
                d.copy_(s)

    def move(self, src: int, dst: int) -> None:
        self.moves([(src, dst)])

    def moves(self, pairs: list[tuple[int, int]]) -> None:
        """Row `dst` of each (src, dst) takes what row `src` held before any of these moves (chains and swaps
        included; each dst once). One move copies row to row; more run one gather and one scatter per state
        tensor, whatever their number, from one index upload per device."""
        if len(pairs) == 1:
            src, dst = pairs[0]
            self.put(dst, (self.talker_views(src), self.vae_views(src)))
        elif pairs:
            if len({dst for _, dst in pairs}) != len(pairs):
                raise ValueError(f"row moves {pairs} write a row twice")
            order = [[src for src, _ in pairs], [dst for _, dst in pairs]]
            _gather_scatter(self._talker_state(), upload(order, torch.int64, self.cache.k.device))
            with self._gpu.vae():
                _gather_scatter(self._vae_state(), upload(order, torch.int64, self.vae_device))


def _gather_scatter(state: list[tuple[torch.Tensor, int]], order: torch.Tensor) -> None:
    """Rows order[0] of each tensor into rows order[1] (the gather copies first, so sources may be overwritten)."""
    for t, dim in state:
        t.index_copy_(dim, order[1], t.index_select(dim, order[0]))
