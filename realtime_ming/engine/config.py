"""Engine configuration: model source, placement, capacities and stage policies (one frozen dataclass tree)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from .segmenter import SegmenterConfig

__all__ = ["EngineConfig", "PlacementConfig", "ThinkerRunnerConfig", "TalkerRunnerConfig"]

_DTYPES = ("float32", "bfloat16", "float16")
EXPERT_DTYPES = ("model", "fp8")  # engine.expert_dtype (model/fp8.py)


@dataclass(frozen=True, slots=True)
class PlacementConfig:
    """Which device runs each stage. The thinker spans `thinker_devices` with tensor parallelism.

    The talker runs as one replica on `talker_device` with its AudioVAE on `vae_device` (both default cpu), or,
    with `talker_devices` (a list), as one full talker + AudioVAE replica per listed device (data parallel: each
    turn is spoken by one replica; a device may be listed twice). With the list, each replica's VAE is on its own
    talker device: `talker_device` and `vae_device` may then be left out or set to the list's first device (what
    both read back as), anything else is an error.
    """

    thinker_devices: tuple[str, ...] = ("cpu",)  # the thinker, tensor-parallel over these (e.g. [cuda:0, cuda:1])
    talker_device: str | None = None  # None: cpu, or talker_devices[0]
    encoder_device: str = "cpu"  # the audio and vision encoders
    vae_device: str | None = None  # None: cpu, or talker_devices[0]
    talker_devices: tuple[str, ...] = ()  # () = the one replica of talker_device / vae_device

    def __post_init__(self):
        if not self.thinker_devices:
            raise ValueError("engine.placement.thinker_devices must name at least one device")
        if not self.talker_devices:
            object.__setattr__(self, "talker_device", self.talker_device or "cpu")
            object.__setattr__(self, "vae_device", self.vae_device or "cpu")
            return
        first = self.talker_devices[0]
        for key in ("talker_device", "vae_device"):
            value = getattr(self, key)
            if value is not None and value != first:
                raise ValueError(
                    f"engine.placement.{key} is {value!r} but engine.placement.talker_devices is "
                    f"{list(self.talker_devices)}: with talker_devices every replica's talker and VAE are on its "
                    f"own listed device, so {key} must be left out (null) or be the first one, {first!r}")
            object.__setattr__(self, key, first)

    @property
    def tp_size(self) -> int:
        return len(self.thinker_devices)

    @property
    def talker_replicas(self) -> tuple[tuple[str, str], ...]:
        """(talker device, VAE device) of each talker replica, in order (one without `talker_devices`)."""
        if not self.talker_devices:
            return ((self.talker_device, self.vae_device),)
        return tuple((d, d) for d in self.talker_devices)


def _cuda(thinker_devices) -> bool:
    """Whether a thinker placed on `thinker_devices` (a list, or one name) runs on CUDA."""
    first = thinker_devices if isinstance(thinker_devices, str) else next(iter(thinker_devices), "")
    return str(first).startswith("cuda")


def graph_buckets(capacity: int) -> tuple[int, ...]:
    """CUDA-graph batch sizes up to `capacity` rows: 1, 2, 4, 8, 16, then 24, 32, 48, 64, 96, ... (a batch pads to
    the next one, at most 50 % more rows), and `capacity` itself."""
    ladder, size = [1, 2, 4, 8, 16], 16
    while size < capacity:
        ladder += [size * 3 // 2, size * 2]
        size *= 2
    return tuple(sorted({b for b in ladder if b < capacity} | {capacity}))


# The defaults that differ by the thinker's device (`engine.placement.thinker_devices`), filled into fields left
# as None (null) when an `EngineConfig` is built: "cuda" = what the shipped GPU configs serve, "cpu" = the embedded
# tiny model and CI (the golden fixtures' segmenter). A value set in the config always wins.
DEVICE_DEFAULTS: dict[str, dict[str, object]] = {
    "cuda": {"dtype": "bfloat16", "encoder_worker": False, "thinker.prefill_chunk_tokens": 2048,
             "thinker.mixed_step_tokens": 512, "segmenter": SegmenterConfig(policy="latency", first_mark_wait_ms=60.0)},
    "cpu": {"dtype": "float32", "encoder_worker": True, "thinker.prefill_chunk_tokens": 256,
            "thinker.mixed_step_tokens": 0, "segmenter": SegmenterConfig()},
}


ALL_REDUCE = ("nccl", "one_shot")  # engine.thinker.all_reduce
TURN_JUDGEMENT = ("auto", "on", "off")  # engine.thinker.turn_judgement
TALKER_DRIVERS = ("inline", "process")  # engine.talker.driver


@dataclass(frozen=True, slots=True)
class ThinkerRunnerConfig:
    max_slots: int = 32  # concurrent conversations with a cached KV slot
    max_seq_len: int = 4096  # tokens per slot (prompt + history + output)
    # `truncation: "auto"`: when the history crosses its limit it is cut to this share of the limit at once
    # (`prompt_budget`), so the turns after a cut reuse the cached prefix until the limit is crossed again;
    # 1.0 = drop the fewest messages (then every turn on a full context re-prefills it)
    auto_truncation_ratio: float = 0.75
    max_batch: int = 16  # decode rows per step (CUDA graphs: `graph_buckets(max_batch)`)
    # chunked prefill: at most this many (padded) prompt tokens per step. Every chunk reads each MoE layer's
    # experts once, so on GPUs a large budget lets the prompts of many turns share one read.
    # None: 2048 on CUDA, 256 on CPU
    prefill_chunk_tokens: int | None = None
    # a chunk (which every decoding row's next token and every prompt behind it waits for) is cut to what the host
    # time of the recent chunks says fits in this many ms (`engine/prefill_pace.py`): binds where the host computes
    # the chunk (CPU), not where it only launches it (CUDA); beside decoding rows a long prompt's next chunk waits
    # until the host time since its last chunk equals that chunk's (the streams keep half the host). 0 = always
    # prefill_chunk_tokens, never held
    prefill_step_ms: float = 250.0
    # mixed step: a step that decodes rows AND prefills runs both in one forward of at most this many tokens
    # (the decode rows + the chunk, packed; `engine/thinker_mixed.py`), so the MoE experts are read once, not
    # twice. 0 = off (two forwards). A chunk beside decode rows is then packed into what the rows leave.
    # None: 512 on CUDA, 0 on CPU
    mixed_step_tokens: int | None = None
    # the thinker's judgement of whether the user finished their turn (`TurnTask.JUDGE_TURN`, semantic_vad):
    # "auto" = on only for real checkpoint weights (the tiny / dummy default would judge noise), "on", "off"
    # (YAML's bare on / off read as true / false are taken too)
    turn_judgement: str | bool = "auto"
    # tensor parallelism: "nccl" = every all-reduce over NCCL; "one_shot" = all-reduces up to 1 MiB (decode)
    # through symmetric memory in one kernel (model/kernels/all_reduce.py), larger ones over NCCL
    all_reduce: str = "nccl"

    def __post_init__(self):
        for name in ("max_slots", "max_seq_len", "max_batch", "prefill_chunk_tokens"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"engine.thinker.{name} must be >= 1")
        if self.mixed_step_tokens and self.mixed_step_tokens <= self.max_batch:
            raise ValueError(f"engine.thinker.mixed_step_tokens must be 0 (off) or above max_batch "
                             f"({self.max_batch}), got {self.mixed_step_tokens}")
        if not 0.0 <= self.prefill_step_ms <= 60_000.0:  # NaN fails too
            raise ValueError(f"engine.thinker.prefill_step_ms must be in [0, 60000] ms, got {self.prefill_step_ms!r}")
        if not 0.0 <= self.auto_truncation_ratio <= 1.0:  # NaN fails too
            raise ValueError(f"engine.thinker.auto_truncation_ratio must be in [0, 1], got {self.auto_truncation_ratio!r}")
        if isinstance(self.turn_judgement, bool):
            object.__setattr__(self, "turn_judgement", "on" if self.turn_judgement else "off")
        if self.turn_judgement not in TURN_JUDGEMENT:
            raise ValueError(f"engine.thinker.turn_judgement must be one of {TURN_JUDGEMENT}, got {self.turn_judgement!r}")
        if self.all_reduce not in ALL_REDUCE:
            raise ValueError(f"engine.thinker.all_reduce must be one of {ALL_REDUCE}, got {self.all_reduce!r}")

    @property
    def decode_buckets(self) -> tuple[int, ...]:
        """CUDA-graph batch sizes of the decode step (above the largest a step runs eager)."""
        return graph_buckets(self.max_batch)


@dataclass(frozen=True, slots=True)
class TalkerRunnerConfig:
    max_streams: int = 16  # talker streams stepped together
    max_prompt_len: int = 512  # talker LM prompt + generated steps per fragment (the tiny model: >= 1024)
    # CUDA-graph batch sizes of the talker and VAE steps; None = `graph_buckets(max_streams)`
    buckets: tuple[int, ...] | None = None
    # a cloned voice's prompt (transcript + audio patches) may take max_prompt_len // 2 − this many talker
    # tokens, so every job keeps room for this much reply text (fewer, longer jobs per segment)
    min_text_tokens: int = 32
    voice_head_cache: int = 32  # voices whose prompt head (system … transcript K/V) is kept; 0 = off
    silence_holder: bool = True  # the reference's trailing-silence holder on each stream (§6.4)
    # who steps the talker (`engine/talker_driver.py`): "inline" = the engine thread, once per engine step, beside
    # the thinker's step; "process" = each talker replica in a process of its own at its own pace (the weights
    # shared, not copied; `engine/talker_process.py`), for talker replicas on GPUs apart from the thinker's (the same
    # audio; docs/benchmarks.md). A talker process that exits kills the engine
    driver: str = "inline"
    # driver "process": talker steps queued back to back per launch (new jobs start and stop decisions are taken once
    # per launch; a stream that ends early keeps nothing of the steps after its end: the audio is the same)
    steps_per_launch: int = 1
    # the next launch is queued on the GPU before the last one's outputs are read (stop decisions, VAE chunks, PCM),
    # so the talker's GPU does not wait for that host work (the VAE runs on a stream of its own:
    # engine/talker_sync.py). A stream is stepped once more after its last step (the audio is the same); a job's
    # next segment starts one launch later. Inline, the talker's output (a turn's first audio too) comes one
    # engine step later and the engine thread's host work overlaps the GPU's next step
    pipeline: bool = False

    def __post_init__(self):
        if self.max_streams < 1:
            raise ValueError("engine.talker.max_streams must be >= 1")
        if self.buckets is None:
            object.__setattr__(self, "buckets", graph_buckets(self.max_streams))
        elif not self.buckets or min(self.buckets) < 1:
            raise ValueError("engine.talker.buckets must be positive batch sizes")
        if self.voice_head_cache < 0:
            raise ValueError("engine.talker.voice_head_cache must be >= 0")
        if self.driver not in TALKER_DRIVERS:
            raise ValueError(f"engine.talker.driver must be one of {TALKER_DRIVERS}, got {self.driver!r}")
        if not 1 <= self.steps_per_launch <= 8:
            raise ValueError(f"engine.talker.steps_per_launch must be in [1, 8], got {self.steps_per_launch!r}")
        if self.steps_per_launch > 1 and self.driver != "process":
            raise ValueError("engine.talker.steps_per_launch > 1 needs engine.talker.driver: process (the inline "
                             "talker steps once per engine step)")
        if not 0 <= self.min_text_tokens < self.max_prompt_len // 2:
            raise ValueError("engine.talker.min_text_tokens must be in [0, max_prompt_len // 2)")

    @property
    def voice_prompt_budget(self) -> int:
        """Talker tokens a cloned voice's prompt (with an empty reply text) may take."""
        return self.max_prompt_len // 2 - self.min_text_tokens

    @property
    def caption_budget(self) -> int:
        """Talker tokens a speech-style caption may take: a job's prompt without it is at most max_prompt_len // 2
        (longer text is spoken in halves), and the caption must leave that, the 2 tokens the prompt must stay under
        max_prompt_len by, and min_text_tokens steps of generation."""
        return self.max_prompt_len - self.max_prompt_len // 2 - 2 - self.min_text_tokens


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Everything the engine needs. `model_path=None` serves the embedded tiny random-weight model."""

    model_path: str | None = None  # checkpoint folder; None = the embedded tiny random-weight model
    tokenizer_path: str | None = None  # thinker tokenizer.json (file or folder) when the checkpoint lacks one
    talker_tokenizer_path: str | None = None  # talker tokenizer.json when talker/llm/ lacks one
    weights: str = "checkpoint"  # "checkpoint" | "dummy" (seeded random weights, any preset)
    preset: str | None = None  # with weights="dummy": "tiny" | "ming-flash-omni-2.0"
    dtype: str | None = None  # "float32" | "bfloat16" | "float16"; None: bfloat16 on CUDA, float32 on CPU
    # the thinker's routed experts (99.9 B of the root's 104 B parameters): "model" = in `dtype`; "fp8" = e4m3 with
    # one fp32 scale per output channel, quantised from the checkpoint while it loads (never the whole bf16 model in
    # host memory), run by the FP8 Triton kernels (model/kernels/moe_fp8.py); router, shared expert, attention and
    # every other model stay in `dtype`. Fidelity: docs/fidelity.md
    expert_dtype: str = "model"
    seed: int = 0  # dummy weights' seed
    default_voice: str | None = None  # the voice of sessions that name none; None = the first preset
    enforce_eager: bool = False  # CUDA graphs off (debugging; a CPU device always runs eager)
    placement: PlacementConfig = field(default_factory=PlacementConfig)
    thinker: ThinkerRunnerConfig = field(default_factory=ThinkerRunnerConfig)
    talker: TalkerRunnerConfig = field(default_factory=TalkerRunnerConfig)
    # None: the device's (`DEVICE_DEFAULTS`): on CUDA the latency policy, its first segment held up to 60 ms for a
    # clause or sentence mark; on CPU the reference policy (the golden fixtures). In a config file the keys a
    # segmenter section leaves out keep the device's (`file_sections`)
    segmenter: SegmenterConfig | None = None
    # bounded speculation (`engine/speculation.py`): an unconfirmed speculative turn pauses (thinker row and talker
    # stream kept, not stepped) once it holds this much audio ...
    speculation_lookahead_ms: float | None = 1000.0
    # ... and its thinker row pauses once it has generated this many tokens (a text-only turn's bound; an audio
    # turn reaches its audio lookahead long before). None: no bound (the turn runs to its end while unconfirmed)
    speculation_lookahead_tokens: int | None = 64
    input_workers: int = 2  # threads preparing requests (chat template, tokens, media) off the engine thread
    media_cache_mb: int = 512  # preprocessed media kept by content (history images are not preprocessed again)
    # admission's audio/vision encoders on their own thread and CUDA stream (running turns keep decoding while a
    # burst is encoded); false: on the engine thread. One worker serialises a burst, so under many sessions its
    # queue grows (docs/benchmarks.md). None: false on CUDA, true on CPU
    encoder_worker: bool | None = None

    def __post_init__(self):
        self._fill_device_defaults()
        if self.weights not in ("checkpoint", "dummy"):
            raise ValueError("engine.weights must be 'checkpoint' or 'dummy'")
        if self.input_workers < 1:
            raise ValueError("engine.input_workers must be >= 1")
        if self.media_cache_mb < 0:
            raise ValueError("engine.media_cache_mb must be >= 0")
        if self.speculation_lookahead_ms is not None and not 0 <= self.speculation_lookahead_ms <= 60_000:
            raise ValueError("engine.speculation_lookahead_ms must be in [0, 60000] (or null: unbounded)")
        if self.speculation_lookahead_tokens is not None and self.speculation_lookahead_tokens < 1:
            raise ValueError("engine.speculation_lookahead_tokens must be >= 1 (or null: unbounded)")
        if self.dtype not in _DTYPES:
            raise ValueError(f"engine.dtype must be one of {_DTYPES}")
        if self.expert_dtype not in EXPERT_DTYPES:
            raise ValueError(f"engine.expert_dtype must be one of {EXPERT_DTYPES}, got {self.expert_dtype!r}")
        if self.weights == "checkpoint" and self.preset is not None and self.model_path is not None:
            raise ValueError("engine.preset applies only to weights='dummy' or the embedded default")

    @staticmethod
    def file_sections(data: dict) -> dict:
        """A config file's engine section, its segmenter section completed by the device default: `policy` and,
        for that same policy, `first_mark_wait_ms` keep the device's when left out (the config loader calls it)."""
        section = data.get("segmenter")
        if not isinstance(section, dict):
            return data
        devices = (data.get("placement") or {}).get("thinker_devices") or PlacementConfig().thinker_devices
        base = DEVICE_DEFAULTS["cuda" if _cuda(devices) else "cpu"]["segmenter"]
        section = {"policy": base.policy, **section}
        if section["policy"] == base.policy and "first_mark_wait_ms" not in section:
            section["first_mark_wait_ms"] = base.first_mark_wait_ms
        return {**data, "segmenter": section}

    @property
    def on_cuda(self) -> bool:
        """Whether the thinker runs on CUDA devices (which `DEVICE_DEFAULTS` row fills the fields left None)."""
        return _cuda(self.placement.thinker_devices)

    def _fill_device_defaults(self) -> None:
        defaults = DEVICE_DEFAULTS["cuda" if self.on_cuda else "cpu"]
        thinker = {k: defaults[f"thinker.{k}"] for k in ("prefill_chunk_tokens", "mixed_step_tokens")
                   if getattr(self.thinker, k) is None}
        if thinker:
            object.__setattr__(self, "thinker", replace(self.thinker, **thinker))
        for key in ("dtype", "encoder_worker", "segmenter"):
            if getattr(self, key) is None:
                object.__setattr__(self, key, defaults[key])

    def fitted_to_tiny(self) -> "EngineConfig":
        """This config for the embedded tiny model: its byte-level talker tokenizer spends one token per UTF-8 byte,
        so a speech-style caption (the reference's JSON with Chinese labels, ~280 bytes) needs a talker prompt of at
        least `TINY_TALKER_PROMPT_LEN` (a real checkpoint's tokenizer takes it in ~100 tokens of the default 512)."""
        if self.talker.max_prompt_len >= TINY_TALKER_PROMPT_LEN:
            return self
        return replace(self, talker=replace(self.talker, max_prompt_len=TINY_TALKER_PROMPT_LEN))


TINY_TALKER_PROMPT_LEN = 1024
