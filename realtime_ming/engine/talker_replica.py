"""One talker replica: a talker + AudioVAE on their devices, and the voices copied there.

`engine.placement.talker_devices` runs the talker data parallel (`engine/talker_pool.py`): every listed
device holds a full replica, each a copy of the same tensors (`ModelBundle.load` loads or initialises the
talker and VAE once, on the first device, and copies them), so a stream's audio does not depend on which
replica speaks it. Voices are registered once, on the first replica's talker device (the presets at load,
clones at run time through `VoiceEncoder`); `VoiceCopies` gives each other device its own copy of a voice's
prompt the first time a stream there speaks in it, and keeps it while the voice lives.
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass, field

import torch

from ..model.talker import Talker, VoicePrompt
from ..model.vae import AudioVAE

__all__ = ["TalkerReplica", "VoiceCopies", "first_replica", "resolved_device"]


def resolved_device(device: torch.device | str) -> torch.device:
    """`device` as tensors report it (`cuda` → `cuda:<current>`): comparable with `tensor.device`."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


class VoiceCopies:
    """Each voice's prompt on one device: the voice itself when it is there already, else a copy made at
    its first use and kept until the voice is dropped (a replaced preset or an evicted clone frees its copy).

    A copy is a stable object per voice, so the runner's voice-head cache (keyed by the voice prompt's
    identity) keeps working on every replica."""

    def __init__(self, device: torch.device | str):
        self.device = resolved_device(device)
        self._copies: dict[int, tuple[weakref.ref, VoicePrompt]] = {}
        self._lock = threading.RLock()  # the engine thread copies; a voice may be dropped on any thread (or by the GC)

    def __len__(self) -> int:
        return len(self._copies)

    def __call__(self, voice: VoicePrompt) -> VoicePrompt:
        if voice.prompt_lat.device == self.device:
            return voice
        key = id(voice)
        with self._lock:
            kept = self._copies.get(key)
            if kept is not None and kept[0]() is voice:
                return kept[1]
        move = lambda t: None if t is None else t.to(self.device, non_blocking=False)  # noqa: E731
        copy = VoicePrompt(move(voice.spk_embed), move(voice.prompt_lat), move(voice.prompt_emb))
        with self._lock:
            self._copies[key] = (weakref.ref(voice, self._dropper(key)), copy)
        return copy

    def _dropper(self, key: int):
        owner = weakref.ref(self)  # the callback must not keep this cache alive

        def drop(ref: weakref.ref) -> None:
            copies = owner()
            if copies is None:
                return
            with copies._lock:
                kept = copies._copies.get(key)
                if kept is not None and kept[0] is ref:
                    del copies._copies[key]

        return drop


@dataclass(eq=False)
class TalkerReplica:
    """A talker and its AudioVAE on their devices (`index` within `engine.placement.talker_replicas`)."""

    index: int
    talker: Talker
    vae: AudioVAE
    device: torch.device  # the talker's
    vae_device: torch.device
    voices: VoiceCopies = field(init=False)

    def __post_init__(self) -> None:
        self.voices = VoiceCopies(self.device)

    @property
    def name(self) -> str:
        """`talker_device` (or `talker_device+vae_device` when they differ), for logs and `info()`."""
        same = self.device == self.vae_device
        return str(self.device) if same else f"{self.device}+{self.vae_device}"


def first_replica(bundle) -> TalkerReplica:
    """The bundle's first talker replica (`bundle.talker` / `bundle.vae` on their devices)."""
    if bundle.talker_replicas:
        return bundle.talker_replicas[0]
    return TalkerReplica(0, bundle.talker, bundle.vae, torch.device(bundle.devices["talker"]),
                         torch.device(bundle.devices["vae"]))
