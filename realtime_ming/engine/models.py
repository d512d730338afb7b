"""Loading every model the engine runs, and the media encoders' serving entry points.

`ModelBundle.load(cfg)` resolves the checkpoint (a folder, or the embedded tiny default),
loads or dummy-initialises the thinker + encoders, talker and AudioVAE on their devices,
resolves both tokenizers and registers the voice presets (VAE latents of the prompt wav,
CAMPPlus speaker vector when `talker/campplus.onnx` is present).
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from tokenizers import Tokenizer

from ..model.audio_encoder import AudioProjector, WhisperEncoder, audio_token_lengths, max_mel_frames
from ..model.campplus import CampPlus
from ..model.config import CheckpointConfig, load_checkpoint_config
from ..model.image_processing import MAX_ASPECT_RATIO, VisionInput, image_grid, preprocess_image
from ..model.kernels import TRITON, Kernels
from ..model.kernels import available as triton_available
from ..model.layers import TPGroup
from ..model.loader import init_dummy, load_weights, materialize, read_weight_map
from ..model.presets import preset_config
from ..model.talker import Talker, TalkerSpecialIds, VoicePrompt
from ..model.thinker import Thinker
from ..model.tiny_tokenizer import TINY_VOCAB_SIZE, tiny_talker_special_ids, tiny_thinker_special_ids, tiny_thinker_tokenizer, tiny_tokenizer_path
from ..model.tokenizer import ThinkerTokenizer, check_talker_tokenizer, resolve_tokenizer
from ..model.vae import AudioVAE
from ..model.vision import VisionProjector, VisionTransformer
from .audio_graphs import CLIP_BUCKETS, AudioEncoderGraphs
from .config import EngineConfig
from .hooks import NO_HOOKS, EngineHooks
from .talker_replica import TalkerReplica, resolved_device
from .voice_prompt import VoiceEncoder

__all__ = ["ModelBundle", "TINY_NOTICE", "adopt_replica", "standin_tokenizers"]

log = logging.getLogger(__name__)

TINY_NOTICE = ("serving the embedded TINY random-weight Ming model: its text and audio are random noise, "
               "not meaningful speech (use --model-path for the real checkpoint)")

Progress = Callable[[str, int, int], None]
_KERNELS = TRITON  # every Triton kernel where a model runs on CUDA (no kernel applies on CPU)
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _build(cls, *args, weights=None, prefix="", device, dtype, seed, what, progress=None,
           kernels: Kernels | None = None, **options):
    module = _meta(cls, args, kernels, **options)
    if weights is None:
        init_dummy(module, seed=seed, device=device, dtype=dtype)
    else:
        cb = (lambda d, t: progress(what, d, t)) if progress else None
        load_weights(module, weights, prefix=prefix, device=device, dtype=dtype, what=what, progress=cb)
    return module.eval()


def _meta(cls, args: tuple, kernels: Kernels | None, **options):
    with torch.device("meta"):
        return cls(*args, **options) if kernels is None else cls(*args, kernels=kernels, **options)


def _replicate(module, cls, *args, device, dtype, kernels: Kernels | None = None):
    """A copy of `module` (built as `cls(*args)`) on `device`: the same parameters and persistent buffers,
    copied tensor for tensor (computed buffers are recomputed as at load)."""
    return _adopt(cls, args, module.state_dict(), device=device, dtype=dtype, kernels=kernels, share=False)


def _adopt(cls, args: tuple, state: dict, *, device, dtype, kernels: Kernels | None, share: bool):
    """`cls(*args)` on `device` holding `state`'s tensors (`share`: the tensors themselves, else copies)."""
    module = materialize(_meta(cls, args, kernels), device, dtype)
    with torch.no_grad():
        module.load_state_dict(state, strict=True, assign=share)
    return module.eval()


def _all_on(state: dict, device: torch.device, what: str) -> None:
    """Refuse adopted tensors on another device than the replica's: `load_state_dict(assign=True)` would keep them
    where they are, and a kernel launched on `device` would read another GPU's memory (a fault or a stall, not an
    error at the line that placed them)."""
    device = resolved_device(device)
    wrong = sorted({f"{name} on {t.device}" for name, t in state.items() if t.device != device})
    if wrong:
        raise ValueError(f"the {what}'s adopted tensors must be on {device}: {len(wrong)} are not "
                         f"({', '.join(wrong[:3])}{', ...' if len(wrong) > 3 else ''})")


def adopt_replica(ck: CheckpointConfig, index: int, talker_state: dict, vae_state: dict, *, device: torch.device,
                  vae_device: torch.device, dtype: torch.dtype) -> TalkerReplica:
    """A talker replica built around another process's tensors (`engine/talker_process.py`: shared through CUDA
    IPC or shared memory, not copied), with the kernels `ModelBundle.load` gives the talker and the VAE."""
    _all_on(talker_state, device, "talker")
    _all_on(vae_state, vae_device, "VAE")
    talker = _adopt(Talker, (ck.talker,), talker_state, device=device, dtype=dtype, kernels=_KERNELS, share=True)
    vae = _adopt(AudioVAE, (ck.vae,), vae_state, device=vae_device, dtype=dtype, kernels=_KERNELS, share=True)
    if device.type == "cuda":
        torch.cuda.empty_cache()  # the tensors `materialize` allocated before the shared ones replaced them
    return TalkerReplica(index, talker, vae, device, vae_device)


@dataclass
class ModelBundle:
    """Everything loaded, on its device, in eval mode."""

    name: str
    cfg: CheckpointConfig
    dtype: torch.dtype
    thinker: Thinker
    audio_encoder: WhisperEncoder
    audio_projector: AudioProjector
    vision: VisionTransformer
    vision_projector: VisionProjector
    talker: Talker
    vae: AudioVAE
    tokenizer: ThinkerTokenizer
    talker_tokenizer: Tokenizer
    talker_special: TalkerSpecialIds
    voices: dict = field(default_factory=dict)  # name -> (VoicePrompt, prompt_text)
    default_voice: str = ""
    is_tiny_default: bool = False
    devices: dict = field(default_factory=dict)
    audio_graphs: AudioEncoderGraphs | None = None  # the encoder + projector per clip-length bucket
    voice_encoder: VoiceEncoder | None = None  # registers voices (presets at load, clones at run time)
    # the talker + VAE per `engine.placement.talker_replicas` entry; the first is `talker` / `vae` themselves
    talker_replicas: list[TalkerReplica] = field(default_factory=list)
    hooks: EngineHooks = NO_HOOKS  # test and benchmark substitutions (`engine/hooks.py`)

    has_talker = True

    # ---- loading ---------------------------------------------------------------------------
    @classmethod
    def load(cls, cfg: EngineConfig, progress: Progress | None = None,
             hooks: EngineHooks | None = None) -> "ModelBundle":
        hooks = hooks or NO_HOOKS
        hooks.check(cfg)
        dtype = _DTYPES[cfg.dtype]
        place = cfg.placement
        devices = {"thinker": place.thinker_devices[0], "talker": place.talker_device,
                   "encoder": place.encoder_device, "vae": place.vae_device}
        tiny = cfg.model_path is None and cfg.preset in (None, "tiny")
        if tiny:
            thinker_tok = tiny_thinker_tokenizer()
            talker_tok = Tokenizer.from_file(str(tiny_tokenizer_path("talker")))
            ck = preset_config("tiny", thinker_ids=tiny_thinker_special_ids(), talker_ids=tiny_talker_special_ids(),
                               vocab=TINY_VOCAB_SIZE)
            name = "ming-tiny-random"
            dummy = True
        elif cfg.model_path is None:
            # real shapes, random weights: stand-in BPE tokenizers placed on the real special ids
            ck = preset_config(cfg.preset)
            thinker_tok, talker_tok = standin_tokenizers(ck, [hooks.forced_reply or "", hooks.forced_transcript or ""])
            name = f"{cfg.preset}-dummy"
            dummy = True
        else:
            ck = load_checkpoint_config(cfg.model_path)
            thinker_tok = resolve_tokenizer(cfg.model_path, cfg.tokenizer_path)
            talker_tok = _talker_tokenizer(Path(cfg.model_path), cfg.talker_tokenizer_path)
            name = Path(cfg.model_path).name
            dummy = cfg.weights == "dummy"
        # a tokenizer of another checkpoint would run on wrong control ids: refuse it at start
        thinker_tok.check_config(ck.thinker, source=f"thinker tokenizer ({cfg.tokenizer_path or 'checkpoint'})")
        if ck.talker is not None and ck.talker.llm is not None:
            check_talker_tokenizer(talker_tok, ck.talker.llm,
                                   source=f"talker tokenizer ({cfg.talker_tokenizer_path or 'checkpoint'})")
        root_w = talker_w = vae_w = None
        if not dummy:
            folder = Path(cfg.model_path)
            root_w = read_weight_map(folder)
            talker_w = read_weight_map(folder / "talker" / "model.safetensors")
            vae_w = read_weight_map(folder / "talker" / "vae" / "model.safetensors")
        common = dict(dtype=dtype, seed=cfg.seed, progress=progress)
        kernels = _KERNELS
        ming = ck.ming
        hidden = ming.llm_config.hidden_size
        if place.tp_size > 1:
            from .tp import start_tp

            thinker = start_tp(ck, place.thinker_devices, None if dummy else cfg.model_path, dtype, cfg.seed,
                               cfg.thinker.max_slots, cfg.thinker.max_seq_len, kernels=kernels,
                               all_reduce=cfg.thinker.all_reduce, expert_dtype=cfg.expert_dtype)
        else:
            shadow = hooks.tp_shadow
            tp = TPGroup(0, shadow, shadow=True) if shadow > 1 else TPGroup()
            if shadow > 1:
                log.warning("tp_shadow=%d: the thinker is rank 0 of TP=%d alone on %s, collectives skipped "
                            "(benchmark of per-GPU cost; its output is meaningless)", shadow, shadow, devices["thinker"])
            thinker = _build(Thinker, ming.llm_config, tp, weights=root_w, prefix="model.",
                             device=devices["thinker"], what="thinker", kernels=kernels,
                             expert_dtype=cfg.expert_dtype, **common)
        audio_encoder = _build(WhisperEncoder, ming.audio_config, weights=root_w, prefix="audio.",
                               device=devices["encoder"], what="audio encoder", **common)
        audio_projector = _build(AudioProjector, ming.audio_config, hidden, weights=root_w,
                                 prefix="linear_proj_audio.", device=devices["encoder"], what="audio projector", **common)
        vision = _build(VisionTransformer, ming.vision_config, weights=root_w, prefix="vision.",
                        device=devices["encoder"], what="vision", **common)
        vision_projector = _build(VisionProjector, ming.vision_config, hidden, weights=root_w, prefix="linear_proj.",
                                  device=devices["encoder"], what="vision projector", **common)
        talker = _build(Talker, ck.talker, weights=talker_w, device=devices["talker"], what="talker", kernels=kernels,
                        **common)
        vae = _build(AudioVAE, ck.vae, weights=vae_w, device=devices["vae"], what="vae", kernels=kernels, **common)
        replicas = [TalkerReplica(0, talker, vae, torch.device(devices["talker"]), torch.device(devices["vae"]))]
        for i, (talker_dev, vae_dev) in enumerate(place.talker_replicas[1:], start=1):  # copies of the same tensors
            replicas.append(TalkerReplica(
                i, _replicate(talker, Talker, ck.talker, device=talker_dev, dtype=dtype, kernels=kernels),
                _replicate(vae, AudioVAE, ck.vae, device=vae_dev, dtype=dtype, kernels=kernels),
                torch.device(talker_dev), torch.device(vae_dev)))
        special = TalkerSpecialIds(**{
            f: _token_id(talker_tok, tok) for f, tok in (
                ("im_start", "<|im_start|>"), ("im_end", "<|im_end|>"), ("vision_start", "<|vision_start|>"),
                ("vision_pad", "<|vision_pad|>"), ("vision_end", "<|vision_end|>"), ("audio", "<audio>"),
                ("audio_patch", "<audioPatch>"))})
        bundle = cls(name, ck, dtype, thinker, audio_encoder, audio_projector, vision, vision_projector, talker, vae,
                     thinker_tok, talker_tok, special, is_tiny_default=tiny, devices=devices,
                     talker_replicas=replicas, hooks=hooks)
        bundle.audio_graphs = AudioEncoderGraphs(audio_encoder, audio_projector, ming.audio_config,
                                                 CLIP_BUCKETS, dtype=dtype, device=devices["encoder"],
                                                 out_device=devices["thinker"], enforce_eager=cfg.enforce_eager)
        if any(torch.device(d).type == "cuda" for d in devices.values()):
            if not triton_available():
                log.warning("Triton is not installed: the CUDA models run the reference PyTorch ops (slower)")
        bundle._register_voices(progress, cfg.talker.voice_prompt_budget)
        bundle.default_voice = cfg.default_voice or next(iter(bundle.voices))
        if bundle.default_voice not in bundle.voices:
            raise ValueError(f"default voice {bundle.default_voice!r} not among {sorted(bundle.voices)}")
        if tiny:
            log.warning(TINY_NOTICE)
        return bundle

    def with_hooks(self, hooks: EngineHooks) -> "ModelBundle":
        """This bundle (the same models) with other test / benchmark hooks: for tests that reuse one bundle."""
        return dataclasses.replace(self, hooks=hooks)

    def _register_voices(self, progress: Progress | None, voice_prompt_budget: int) -> None:
        campplus = None
        onnx = Path(self.cfg.root) / "talker" / "campplus.onnx" if self.cfg.root else None
        if onnx is not None and onnx.is_file():
            campplus = CampPlus(onnx)
        elif not self.is_tiny_default:
            log.warning("talker/campplus.onnx not found: voices are used without a speaker embedding")
        tok = self.talker_tokenizer
        # a voice may take half the talker prompt less room for text: the talker speaks longer text in halves
        self.voice_encoder = VoiceEncoder(self.talker, self.vae, campplus, torch.device(self.devices["talker"]),
                                          torch.device(self.devices["vae"]), self.dtype,
                                          lambda text: tok.encode(text, add_special_tokens=False).ids,
                                          self.talker_special, voice_prompt_budget)
        for i, (name, preset) in enumerate(self.cfg.voices.items()):
            if progress:
                progress("voices", i, len(self.cfg.voices))
            wav = preset.prompt_wav_path
            if wav is not None and not Path(wav).is_file():
                log.warning("voice %s: prompt wav %s missing; using it without a voice prompt", name, wav)
                wav = None
            self.set_preset_voice(name, preset.prompt_text, wav)

    def set_preset_voice(self, name: str, prompt_text: str, prompt_wav: str | Path | None) -> None:
        """Register (or replace) the checkpoint voice `name` from its prompt wav + transcript, as at load
        (the reference's resampler); without a wav the voice has no prompt. Benchmarks give the dummy
        presets (whose wav is not shipped) a prompt this way."""
        talker, dev = self.talker, self.devices["talker"]
        if prompt_wav is None:
            empty = torch.zeros(1, 0, talker.latent_dim, device=dev, dtype=self.dtype)
            self.voices[name] = (VoicePrompt(None, empty, torch.zeros(1, 0, talker.hidden_size, device=dev,
                                                                     dtype=self.dtype)), "")
            return
        import soundfile

        from ..audio.resample import resample_torchaudio_compatible

        wav, sr = soundfile.read(str(prompt_wav), dtype="float32", always_2d=True)
        wave = torch.from_numpy(np.ascontiguousarray(wav[:, 0]))
        # the reference's (torchaudio) resampler: presets match the reference's registration bit for bit
        voice = self.voice_encoder.encode(wave, sr, prompt_text, resample_torchaudio_compatible)
        self.voices[name] = (voice, prompt_text)

    # ---- serving helpers -------------------------------------------------------------------
    @torch.no_grad()
    def encode_audio(self, wave_16k: np.ndarray, graphed: bool = True) -> torch.Tensor:
        """16 kHz float32 mono -> projected, L2-normalised audio embeddings [N, D] on the thinker device
        (through the clip-length graphs once captured; `graphed=False`: the eager exact-length path)."""
        from ..audio.mel import log_mel_spectrogram

        # the mel is computed where the encoder runs: on a GPU no FFT work lands on the engine thread's CPU
        mel = log_mel_spectrogram(np.asarray(wave_16k, dtype=np.float32), device=self.audio_graphs.device)
        return self.audio_graphs(mel, graphed=graphed)

    def audio_tokens(self, num_samples_16k: int) -> int:
        from ..audio.mel import MEL_HOP_SAMPLES

        return int(audio_token_lengths(num_samples_16k // MEL_HOP_SAMPLES, self.cfg.ming.audio_config))

    @property
    def audio_clip_samples(self) -> tuple[int, int]:
        """(min, max) 16 kHz samples of one encoder clip: more than n_fft/2 (the mel frontend's reflect
        padding), at most the encoder's window (`max_mel_frames` hops: 30 s for Ming)."""
        from ..audio.mel import MEL_HOP_SAMPLES, MEL_N_FFT

        return MEL_N_FFT // 2 + 1, max_mel_frames(self.cfg.ming.audio_config) * MEL_HOP_SAMPLES

    def audio_clips(self, wave_16k: np.ndarray) -> list[np.ndarray]:
        """One audio content as the clips the encoder takes, in order: audio longer than the window is
        cut into equal consecutive clips within it (each placed as its own `<audio>` block, the way the
        reference places several clips), audio shorter than the minimum is padded with silence."""
        shortest, longest = self.audio_clip_samples
        wave = np.asarray(wave_16k, dtype=np.float32)
        if wave.size < shortest:
            return [np.pad(wave, (0, shortest - wave.size))]
        count = -(-wave.size // longest)
        bounds = [wave.size * k // count for k in range(count + 1)]
        return [wave[a:b] for a, b in zip(bounds, bounds[1:])]

    def vision_input(self, image: np.ndarray) -> VisionInput:
        return preprocess_image(image, self.cfg.preprocessor)

    def image_grid(self, image: np.ndarray) -> tuple[int, int, int]:
        """The patch grid of `vision_input(image)`, computed from the size alone."""
        return image_grid(image.shape[0], image.shape[1], self.cfg.preprocessor)

    def media_limits(self) -> dict:
        """What one media item must satisfy to be prompted (the server validates items against it)."""
        pre = self.cfg.preprocessor
        return {"image_factor": pre.patch_size * pre.merge_size, "image_min_pixels": pre.min_pixels,
                "image_max_pixels": pre.max_pixels, "max_aspect_ratio": MAX_ASPECT_RATIO,
                "audio_min_samples": self.audio_clip_samples[0], "audio_window_samples": self.audio_clip_samples[1]}

    @torch.no_grad()
    def encode_image(self, pixel_values: torch.Tensor, grid_thw) -> torch.Tensor:
        """Pixel rows of one image (or one video frame) -> projected embeddings [N, D] on the thinker device."""
        dev = self.devices["encoder"]
        out = self.vision(pixel_values.to(dev, self.dtype), [tuple(int(v) for v in grid_thw)])
        return self.vision_projector(out).to(self.devices["thinker"])

    def close(self) -> None:
        """Stop tensor-parallel workers, if any."""
        close = getattr(self.thinker, "close", None)
        if callable(close):
            close()

    def info(self) -> dict:
        return {
            "model": self.name,
            "device": self.devices["thinker"],
            "tp_size": self.thinker.tp.size,
            "devices": dict(self.devices),
            "talker_devices": [r.name for r in self.talker_replicas],
            "dtype": str(self.dtype).replace("torch.", ""),
            "voices": list(self.voices),
            "default_voice": self.default_voice,
            "is_tiny_default": self.is_tiny_default,
            "notice": TINY_NOTICE if self.is_tiny_default else None,
            "media": self.media_limits(),
        }


def _token_id(tok: Tokenizer, token: str) -> int:
    i = tok.token_to_id(token)
    if i is None:
        raise ValueError(f"talker tokenizer lacks the special token {token}")
    return i


def standin_tokenizers(ck: CheckpointConfig, extra_text) -> tuple[ThinkerTokenizer, Tokenizer]:
    """Word-piece stand-ins whose special tokens sit on `ck`'s real ids (dummy-weight benchmarks)."""
    from ..model.standin_tokenizer import build_standin_tokenizer

    shift = ck.thinker.eos_token_id - tiny_thinker_special_ids()["<|role_end|>"]
    thinker_ids = {t: i + shift for t, i in tiny_thinker_special_ids().items()}
    thinker = ThinkerTokenizer(build_standin_tokenizer(thinker_ids, ck.thinker.vocab_size, extra_text))
    talker_ids = {t: i + 151500 for t, i in tiny_talker_special_ids().items()}
    talker_ids["<audio>"], talker_ids["<audioPatch>"] = 151665, 151666
    return thinker, build_standin_tokenizer(talker_ids, ck.talker.llm.vocab_size, extra_text)


def _talker_tokenizer(root: Path | None, tokenizer_path: str | None) -> Tokenizer:
    candidates = []
    if root is not None:
        candidates.append(root / "talker" / "llm" / "tokenizer.json")
    if tokenizer_path is not None:
        p = Path(tokenizer_path)
        candidates.append(p / "tokenizer.json" if p.is_dir() else p)
    for path in candidates:
        if path.is_file():
            return Tokenizer.from_file(str(path))
    raise FileNotFoundError(
        "talker tokenizer not found: expected talker/llm/tokenizer.json in the checkpoint "
        f"(looked at {', '.join(map(str, candidates)) or 'no checkpoint folder'}); "
        "pass engine.talker_tokenizer_path to use another file")
