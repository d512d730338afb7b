"""Voice prompts from a waveform + transcript: CAMPPlus speaker vector and AudioVAE prompt latents.

`VoiceEncoder.encode(wave, rate, transcript, resample)` is the talker's voice-registration path
(docs/model.md §5.4): the startup presets (`ModelBundle`, the reference's torchaudio resampler)
and voices cloned at run time (`server/voice_routes.py`, soxr) both go through it, so a cloned
voice is registered exactly like a preset. It is thread-safe and meant to run on a worker thread,
never the engine thread: on CUDA each call queues its work on a side stream of its own and waits
for it, so the engine's streams and graphs are not serialised behind it.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from ..model.campplus import CampPlus
from ..model.talker import Talker, TalkerSpecialIds, VoicePrompt, build_talker_prompt
from ..model.vae import AudioVAE
from .voice_store import VoicePromptTooLong

__all__ = ["SPEAKER_RATE_HZ", "VoiceEncoder", "VoicePromptTooLong", "voice_prompt_bytes"]

SPEAKER_RATE_HZ = 16000  # CAMPPlus' fbank rate
Resampler = Callable[[torch.Tensor, int, int], torch.Tensor]  # (wave [n], src_hz, dst_hz) -> wave


def voice_prompt_bytes(voice: VoicePrompt) -> int:
    """Memory held by a voice prompt's tensors."""
    tensors = (voice.spk_embed, voice.prompt_lat, voice.prompt_emb)
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


def _on(device: torch.device, stream: torch.cuda.Stream | None):
    """`device` current (Triton launches on the current device) and `stream` current, for the block."""
    stack = contextlib.ExitStack()
    if device.type == "cuda":
        stack.enter_context(torch.cuda.device(device))
        if stream is not None:
            stack.enter_context(torch.cuda.stream(stream))
    return stack


@dataclass
class VoiceEncoder:
    """Registers voices for `talker` with `vae` (and `campplus` when the checkpoint has it)."""

    talker: Talker
    vae: AudioVAE
    campplus: CampPlus | None
    talker_device: torch.device
    vae_device: torch.device
    dtype: torch.dtype
    encode_text: Callable[[str], list[int]]  # the talker tokenizer
    special: TalkerSpecialIds
    max_prompt_tokens: int  # a voice's prompt (empty reply text) may use at most this many talker tokens

    def __post_init__(self) -> None:
        self._local = threading.local()  # one CUDA side stream per worker thread and device

    @property
    def vae_rate_hz(self) -> int:
        return self.vae.cfg.sample_rate

    @property
    def samples_per_patch(self) -> int:
        """VAE-rate samples behind one `<audioPatch>` of a voice prompt (hop × VAE patch × talker patch)."""
        return self.vae.samples_per_latent * self.talker.cfg.patch_size

    def max_clip_seconds(self, transcript: str) -> float:
        """The longest clip whose prompt, with `transcript`, fits `max_prompt_tokens` (0 when none does)."""
        fixed = len(build_talker_prompt(self.encode_text, self.special, "",
                                        num_speakers=0 if self.campplus is None else 1,
                                        prompt_text=transcript, prompt_patches=1)) - 1
        patches = max(0, self.max_prompt_tokens - fixed)
        return patches * self.samples_per_patch / self.vae_rate_hz

    def prompt_tokens(self, voice: VoicePrompt, transcript: str) -> int:
        """Talker-prompt length of `voice` with `transcript` and an empty reply text."""
        prompt = build_talker_prompt(self.encode_text, self.special, "",
                                     num_speakers=0 if voice.spk_embed is None else 1,
                                     prompt_text=transcript if voice.num_patches else None,
                                     prompt_patches=voice.num_patches)
        return len(prompt.input_ids)

    def encode(self, wave: torch.Tensor | np.ndarray, rate_hz: int, transcript: str, resample: Resampler | None = None,
               *, check_length: bool = False) -> VoicePrompt:
        """Mono float32 `wave` [n] at `rate_hz` → VoicePrompt on the talker's device, in the engine dtype.

        `resample`: None = `soxr_resampler` (uploads). `check_length`: raise VoicePromptTooLong when transcript +
        latents exceed `max_prompt_tokens`.
        """
        if not isinstance(wave, torch.Tensor):
            wave = torch.from_numpy(np.ascontiguousarray(wave, dtype=np.float32))
        resample = resample or soxr_resampler
        spk = None
        if self.campplus is not None:
            from ..audio.fbank import speaker_fbank

            spk = self.campplus(speaker_fbank(resample(wave, rate_hz, SPEAKER_RATE_HZ)))
        wave_vae = resample(wave, rate_hz, self.vae_rate_hz) if rate_hz != self.vae_rate_hz else wave
        with torch.no_grad():
            vae_stream = self._stream(self.vae_device)
            with _on(self.vae_device, vae_stream):
                posterior, _ = self.vae.encode_prompt(wave_vae[None].to(self.vae_device),
                                                      self.talker.cfg.patch_size)
                mean = posterior.mean  # the reference samples; the mean keeps the voice deterministic (§6.3)
            self._wait(vae_stream)
            talker_stream = self._stream(self.talker_device)
            with _on(self.talker_device, talker_stream):
                spk_t = None if spk is None else torch.as_tensor(spk).to(self.talker_device, self.dtype)
                voice = self.talker.register_voice(spk_t, mean.to(self.talker_device, self.dtype))
            self._wait(talker_stream)
        if check_length:
            used = self.prompt_tokens(voice, transcript)
            if used > self.max_prompt_tokens:
                raise VoicePromptTooLong(
                    f"the voice prompt (transcript + audio) takes {used} talker tokens; at most "
                    f"{self.max_prompt_tokens} fit (with this transcript, clips up to "
                    f"{self.max_clip_seconds(transcript):.1f} s) — use a shorter clip or transcript")
        return voice

    def _stream(self, device: torch.device) -> torch.cuda.Stream | None:
        """This thread's side stream on `device` (None off CUDA or on the thread that loaded the model)."""
        if device.type != "cuda":
            return None
        streams = getattr(self._local, "streams", None)
        if streams is None:
            streams = self._local.streams = {}
        if device not in streams:
            streams[device] = torch.cuda.Stream(device)
        return streams[device]

    @staticmethod
    def _wait(stream: torch.cuda.Stream | None) -> None:
        if stream is not None:
            stream.synchronize()


def soxr_resampler(wave: torch.Tensor, src_hz: int, dst_hz: int) -> torch.Tensor:
    """`Resampler` over soxr (HQ): any rate pair at bounded cost (cloned voices' uploads)."""
    from ..audio.resample import resample

    return torch.from_numpy(resample(np.asarray(wave, dtype=np.float32), src_hz, dst_hz))
