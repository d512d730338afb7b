"""Multimodal thinker inputs: placeholder prompts, 3-D rotary positions, embedding splice, router masks.

Reproduces the prompt expansion of `processing_bailingmm2.py` (docs/model.md §4), the official
`get_t_scale_rope_index` (scale 2.0, §1.5 a) and `BailingMoeV2Model.prompt_wrap_*` (§4): encoder
embeddings replace the `<imagePatch>` / `<framePatch>` / `<audioPatch>` placeholders, whose masks
choose the MultiRouter gates (§1.4). Ids come from the tokenizer; this module only sees integers.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Callable, ClassVar, Mapping, Sequence

import torch

__all__ = [
    "MediaTokenIds",
    "ImageInput",
    "AudioInput",
    "VideoInput",
    "MediaKind",
    "MediaSpan",
    "MultimodalPrompt",
    "PromptBuilder",
    "PrefillInputs",
    "rope_index_3d",
    "get_t_scale_rope_index",
    "splice_embeddings",
    "router_masks",
    "unwrap_audio",
    "prepare_prefill",
    "SPATIAL_MERGE_SIZE",
    "ROPE_T_SCALE",
]

SPATIAL_MERGE_SIZE = 2  # runtime constant of the reference model, not in config.json (§1.1)
ROPE_T_SCALE = 2.0  # scale_factor passed to get_t_scale_rope_index in prefill (§1.5 a)


@dataclass(frozen=True, slots=True)
class MediaTokenIds:
    """Ids of the media control tokens (real: 157158 `<image>` ... ; tiny: real − 156700)."""

    image_start: int
    image_end: int
    image_patch: int
    video_start: int
    video_end: int
    frame_patch: int
    audio_start: int
    audio_end: int
    audio_patch: int

    TOKENS: ClassVar[dict[str, str]] = {
        "image_start": "<image>", "image_end": "</image>", "image_patch": "<imagePatch>",
        "video_start": "<video>", "video_end": "</video>", "frame_patch": "<framePatch>",
        "audio_start": "<audio>", "audio_end": "</audio>", "audio_patch": "<audioPatch>",
    }

    @classmethod
    def from_token_map(cls, token_to_id: Mapping[str, int] | Callable[[str], int | None]) -> "MediaTokenIds":
        """Build from a {token: id} mapping or a lookup function; raises ValueError naming missing tokens."""
        lookup = token_to_id if callable(token_to_id) else token_to_id.get
        ids = {name: lookup(tok) for name, tok in cls.TOKENS.items()}
        missing = [cls.TOKENS[n] for n, v in ids.items() if v is None]
        if missing:
            raise ValueError(f"tokenizer lacks media tokens: {', '.join(missing)}")
        return cls(**ids)


@dataclass(frozen=True, slots=True)
class ImageInput:
    """An image whose ViT grid is `grid_thw` (patches before the 2×2 merge): t·h·w/4 tokens."""

    grid_thw: tuple[int, int, int]


@dataclass(frozen=True, slots=True)
class AudioInput:
    """An audio clip encoded to `num_tokens` projector outputs."""

    num_tokens: int


@dataclass(frozen=True, slots=True)
class VideoInput:
    """A video: one (1, h, w) grid per temporal step, each with its timestamp in seconds."""

    grid_hw: tuple[int, int]
    timestamps_s: tuple[float, ...]


class MediaKind(enum.Enum):
    IMAGE = "image"
    VIDEO_FRAME = "video_frame"
    AUDIO = "audio"


@dataclass(frozen=True, slots=True)
class MediaSpan:
    """Placeholder run [start, start + length) of one image, video frame or audio clip."""

    kind: MediaKind
    start: int
    length: int
    grid_thw: tuple[int, int, int] | None = None  # images and video frames


@dataclass(frozen=True, slots=True)
class MultimodalPrompt:
    """Prompt token ids plus where each media item's placeholders sit."""

    input_ids: tuple[int, ...]
    spans: tuple[MediaSpan, ...] = ()

    def _grids(self, kind: MediaKind) -> list[tuple[int, int, int]]:
        return [s.grid_thw for s in self.spans if s.kind is kind]

    @property
    def image_grid_thw(self) -> list[tuple[int, int, int]]:
        return self._grids(MediaKind.IMAGE)

    @property
    def video_grid_thw(self) -> list[tuple[int, int, int]]:
        """One (1, h, w) row per frame (the interleaved-timestamp layout)."""
        return self._grids(MediaKind.VIDEO_FRAME)

    @property
    def audio_placeholder_loc_lens(self) -> list[tuple[int, int]]:
        """(index right after `<audio>`, number of audio tokens) per clip."""
        return [(s.start, s.length) for s in self.spans if s.kind is MediaKind.AUDIO]

    def tail(self, start: int) -> "MultimodalPrompt":
        """The prompt from token `start` on (new tokens of a cached conversation), spans re-based.

        Raises ValueError if `start` falls inside a media placeholder run.
        """
        spans = []
        for s in self.spans:
            if s.start < start < s.start + s.length:
                raise ValueError(f"cut at {start} splits the {s.kind.value} placeholder [{s.start}, {s.start + s.length})")
            if s.start >= start:
                spans.append(MediaSpan(s.kind, s.start - start, s.length, s.grid_thw))
        return MultimodalPrompt(self.input_ids[start:], tuple(spans))


@dataclass
class PromptBuilder:
    """Accumulates text and media into ids; adjacent text is encoded as one piece.

    `encode_text(str) -> list[int]` must treat its input as literal text (control tokens are added
    by id with `special`). Media expand as in the official processor (§4).
    """

    encode_text: Callable[[str], list[int]]
    media: MediaTokenIds
    merge_size: int = SPATIAL_MERGE_SIZE
    _ids: list[int] = field(default_factory=list, init=False, repr=False)
    _spans: list[MediaSpan] = field(default_factory=list, init=False, repr=False)
    _pending: list[str] = field(default_factory=list, init=False, repr=False)

    def text(self, text: str) -> "PromptBuilder":
        if text:
            self._pending.append(text)
        return self

    def special(self, token_id: int) -> "PromptBuilder":
        self.flush()
        self._ids.append(token_id)
        return self

    def tokens(self, ids) -> "PromptBuilder":
        """Ids already encoded (a cached system turn), appended as they are."""
        self.flush()
        self._ids.extend(ids)
        return self

    @property
    def num_tokens(self) -> int:
        """Ids so far (text not yet encoded is not counted: `flush` first)."""
        return len(self._ids)

    def flush(self) -> None:
        """Encode the text added since the last special token or flush (adjacent text is one piece)."""
        if self._pending:
            self._ids.extend(self.encode_text("".join(self._pending)))
            self._pending.clear()

    def _block(self, start_id: int, patch_id: int, end_id: int, count: int, kind: MediaKind, grid=None) -> None:
        self.special(start_id)
        self._spans.append(MediaSpan(kind, len(self._ids), count, grid))
        self._ids.extend([patch_id] * count)
        self._ids.append(end_id)

    def _count(self, grid: tuple[int, int, int]) -> int:
        t, h, w = grid
        if h % self.merge_size or w % self.merge_size:
            raise ValueError(f"grid {grid} is not a multiple of the {self.merge_size}x{self.merge_size} merge")
        return t * h * w // (self.merge_size ** 2)

    def image(self, item: ImageInput) -> "PromptBuilder":
        """`<image>` `<imagePatch>`×(t·h·w/4) `</image>` then a newline (official expansion)."""
        m = self.media
        grid = tuple(int(v) for v in item.grid_thw)
        self._block(m.image_start, m.image_patch, m.image_end, self._count(grid), MediaKind.IMAGE, grid)
        return self.text("\n")

    def audio(self, item: AudioInput) -> "PromptBuilder":
        """`<audio>` `<audioPatch>`×N `</audio>` (inline placeholder: no newline)."""
        if item.num_tokens < 1:
            raise ValueError("an audio clip needs at least one token")
        m = self.media
        self._block(m.audio_start, m.audio_patch, m.audio_end, item.num_tokens, MediaKind.AUDIO)
        return self

    def video(self, item: VideoInput) -> "PromptBuilder":
        """`<video>` then per frame `<{ts:.1f} seconds>` `<image>` `<framePatch>`×(h·w/4) `</image>`, `</video>`, newline."""
        m = self.media
        grid = (1, int(item.grid_hw[0]), int(item.grid_hw[1]))
        self.special(m.video_start)
        for ts in item.timestamps_s:
            self.text(f"<{ts:.1f} seconds>")
            self._block(m.image_start, m.frame_patch, m.image_end, self._count(grid), MediaKind.VIDEO_FRAME, grid)
        self.special(m.video_end)
        return self.text("\n")

    def add(self, item: "str | ImageInput | AudioInput | VideoInput") -> "PromptBuilder":
        if isinstance(item, str):
            return self.text(item)
        if isinstance(item, ImageInput):
            return self.image(item)
        if isinstance(item, AudioInput):
            return self.audio(item)
        if isinstance(item, VideoInput):
            return self.video(item)
        raise TypeError(f"unsupported prompt item {type(item).__name__}")

    def build(self) -> MultimodalPrompt:
        self.flush()
        return MultimodalPrompt(tuple(self._ids), tuple(self._spans))


def rope_index_3d(
    input_ids: Sequence[int],
    media: MediaTokenIds,
    image_grid_thw: Sequence[Sequence[int]] = (),
    video_grid_thw: Sequence[Sequence[int]] = (),
    *,
    start: int = 0,
    scale: float = ROPE_T_SCALE,
    merge_size: int = SPATIAL_MERGE_SIZE,
    seconds_per_grid: Sequence[float] | None = None,
) -> tuple[torch.Tensor, int]:
    """3-row rotary positions of one sequence: ([3, T] int64, next text position).

    Text runs count up from `start`; each patch run takes the next grid of its kind (video grids
    one (1, h, w) row per frame) and must have exactly t·h·w/merge² tokens (ValueError otherwise);
    t = base + scale·t_idx (× seconds_per_grid for videos if given), h/w centred on t; text resumes
    at max(t) + 1. Every grid must be consumed.
    """
    ids = list(input_ids)
    pos = torch.empty(3, len(ids), dtype=torch.float64)
    queues = {media.image_patch: (list(image_grid_thw), "image"), media.frame_patch: (list(video_grid_thw), "video")}
    used = {media.image_patch: 0, media.frame_patch: 0}
    nxt = float(start)
    i = 0
    while i < len(ids):
        tok = ids[i]
        if tok not in queues:
            pos[:, i] = nxt
            nxt += 1
            i += 1
            continue
        grids, kind = queues[tok]
        k = used[tok]
        if k >= len(grids):
            raise ValueError(f"more {kind} placeholder runs than {kind} grids ({len(grids)})")
        t, h, w = (int(v) for v in grids[k])
        used[tok] = k + 1
        gh, gw = h // merge_size, w // merge_size
        n = t * gh * gw
        run = ids[i:i + n]
        if len(run) != n or any(x != tok for x in run) or (i + n < len(ids) and ids[i + n] == tok):
            actual = next((j for j in range(i, len(ids)) if ids[j] != tok), len(ids)) - i
            raise ValueError(f"{kind} {k}: grid {(t, h, w)} needs {n} placeholder tokens, found a run of {actual}")
        step = scale * (seconds_per_grid[k] if kind == "video" and seconds_per_grid is not None else 1.0)
        ti = torch.arange(t, dtype=torch.float64).view(t, 1, 1).expand(t, gh, gw).reshape(-1) * step + nxt
        hi = torch.arange(gh, dtype=torch.float64).view(1, gh, 1).expand(t, gh, gw).reshape(-1) - (gh - 1) // 2
        wi = torch.arange(gw, dtype=torch.float64).view(1, 1, gw).expand(t, gh, gw).reshape(-1) - (gw - 1) // 2
        pos[:, i:i + n] = torch.stack([ti, ti + hi, ti + wi])
        nxt = float(ti.max()) + 1
        i += n
    for tok, (grids, kind) in queues.items():
        if used[tok] != len(grids):
            raise ValueError(f"{len(grids)} {kind} grids but {used[tok]} {kind} placeholder runs")
    return pos.long(), int(nxt)


def get_t_scale_rope_index(
    input_ids: torch.Tensor,
    media: MediaTokenIds,
    image_grid_thw: torch.Tensor | Sequence | None = None,
    video_grid_thw: torch.Tensor | Sequence | None = None,
    scale_factor: float = ROPE_T_SCALE,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Batched official form: input_ids [B, T] (no padding) -> (position_ids [3, B, T], rope_deltas [B, 1]).

    Grids are consumed across rows in order; a video grid row with t > 1 is split into t frames
    (interleaved timestamps). rope_delta = max(t row) + 1 − T.
    """
    images = [tuple(int(v) for v in g) for g in (image_grid_thw if image_grid_thw is not None else [])]
    videos = []
    for g in (video_grid_thw if video_grid_thw is not None else []):
        t, h, w = (int(v) for v in g)
        videos += [(1, h, w)] * t
    b, t_len = input_ids.shape
    rows, deltas = [], []
    for row in input_ids.tolist():
        n_img = _count_runs(row, media.image_patch)
        n_vid = _count_runs(row, media.frame_patch)
        pos, nxt = rope_index_3d(row, media, images[:n_img], videos[:n_vid], scale=scale_factor)
        images, videos = images[n_img:], videos[n_vid:]
        rows.append(pos)
        deltas.append(nxt - t_len)
    if images or videos:
        raise ValueError(f"{len(images)} image and {len(videos)} video frame grids left without placeholders")
    position_ids = torch.stack(rows, dim=1).to(input_ids.device)
    return position_ids, torch.tensor(deltas, dtype=torch.int64, device=input_ids.device).view(b, 1)


def _count_runs(ids: Sequence[int], tok: int) -> int:
    """Number of maximal runs of `tok` — an upper bound on blocks, exact when blocks are delimited."""
    return sum(1 for j, x in enumerate(ids) if x == tok and (j == 0 or ids[j - 1] != tok))


def unwrap_audio(audio_embeds: torch.Tensor, lengths: torch.Tensor | Sequence[Sequence[int]]) -> list[list[torch.Tensor]]:
    """Official "wrapped" layout [B, N, D] with per-row clip lengths [B, n] -> per row, per clip [n_i, D]."""
    rows = []
    for b, lens in enumerate(lengths.tolist() if torch.is_tensor(lengths) else lengths):
        offsets = [0]
        for n in lens:
            offsets.append(offsets[-1] + int(n))
        rows.append([audio_embeds[b, offsets[j]:offsets[j + 1]] for j in range(len(lens))])
    return rows


def splice_embeddings(
    inputs_embeds: torch.Tensor,
    input_ids: torch.Tensor,
    media: MediaTokenIds,
    *,
    image_embeds: torch.Tensor | None = None,
    video_embeds: torch.Tensor | None = None,
    audio_clips: Sequence[Sequence[torch.Tensor]] = (),
    audio_spans: Sequence[Sequence[tuple[int, int]]] = (),
) -> torch.Tensor:
    """Write encoder outputs into the placeholder positions of `inputs_embeds` [B, T, D] (returns a copy).

    image_embeds [N, D] go, in order, into every `<imagePatch>` position and video_embeds into every
    `<framePatch>` (counts must match exactly); audio_clips[b][j] [n, D] fills span audio_spans[b][j]
    = (start, length), truncated to `length` (a shorter clip is an error). Start/end tokens keep
    their word embeddings. `input_ids` on the CPU (embeddings anywhere): no host sync; on the GPU: host-syncs.
    """
    out = inputs_embeds.clone()
    for embeds, tok, name in ((image_embeds, media.image_patch, "<imagePatch>"),
                              (video_embeds, media.frame_patch, "<framePatch>")):
        mask = input_ids == tok
        have = int(mask.sum())
        rows = 0 if embeds is None else embeds.shape[0]
        if have != rows:
            raise ValueError(f"{have} {name} positions but {rows} embedding rows to splice")
        if rows:
            out[_positions(mask, out.device)] = embeds.to(out.dtype)
    if len(audio_clips) != len(audio_spans):
        raise ValueError("audio_clips and audio_spans need one entry per batch row")
    for b, (clips, spans) in enumerate(zip(audio_clips, audio_spans)):
        if len(clips) != len(spans):
            raise ValueError(f"row {b}: {len(clips)} audio clips for {len(spans)} placeholder spans")
        for clip, (start, length) in zip(clips, spans):
            if clip.shape[0] < length:
                raise ValueError(f"row {b}: audio clip of {clip.shape[0]} tokens for a {length}-token placeholder")
            out[b, start:start + length] = clip[:length].to(out.dtype)
    return out


def _positions(mask: torch.Tensor, device: torch.device):
    """The (row, column) indices of a [B, T] mask, on `device`: a host mask goes up without a host sync."""
    if mask.device == device:
        return mask
    index = mask.nonzero(as_tuple=True)
    if device.type != "cuda":
        return tuple(i.to(device) for i in index)
    return tuple(i.pin_memory().to(device, non_blocking=True) for i in index)


def _to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor on `device`; a CUDA copy goes from pinned memory, without a host sync."""
    if device.type != "cuda":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)


def router_masks(input_ids: torch.Tensor, media: MediaTokenIds,
                 audio_spans: Sequence[Sequence[tuple[int, int]]] = ()) -> tuple[torch.Tensor, torch.Tensor]:
    """(image_mask, audio_mask) [B, T] bool: image/frame patch tokens, and the audio placeholder ranges."""
    image_mask = (input_ids == media.image_patch) | (input_ids == media.frame_patch)
    audio_mask = torch.zeros_like(image_mask)
    for b, spans in enumerate(audio_spans):
        for start, length in spans:
            audio_mask[b, start:start + length] = True
    return image_mask, audio_mask


@dataclass(frozen=True, slots=True)
class PrefillInputs:
    """Everything a thinker prefill of one prompt needs (B = 1)."""

    inputs_embeds: torch.Tensor  # [1, T, D] model dtype
    position_ids: torch.Tensor  # [3, 1, T] int64
    cache_positions: torch.Tensor  # [1, T] int64
    image_mask: torch.Tensor | None  # [1, T] bool, None when the prompt has no image/video
    audio_mask: torch.Tensor | None  # [1, T] bool, None when the prompt has no audio
    rope_delta: int  # rotary position − cache position for the tokens after this prompt


def prepare_prefill(
    embed: Callable[[torch.Tensor], torch.Tensor],
    prompt: MultimodalPrompt,
    media: MediaTokenIds,
    *,
    image_embeds: torch.Tensor | None = None,
    video_embeds: torch.Tensor | None = None,
    audio_clips: Sequence[torch.Tensor] = (),
    cache_start: int = 0,
    rope_delta: int = 0,
    device: torch.device | str = "cpu",
) -> PrefillInputs:
    """Embed `prompt` (the new tokens of a slot, starting at cache position `cache_start` whose
    earlier tokens had `rope_delta`), splice the media, and compute positions and router masks."""
    device = torch.device(device)
    host_ids = torch.tensor([prompt.input_ids], dtype=torch.int64)  # counted and indexed on the host: no sync
    ids = _to_device(host_ids, device)
    spans = prompt.audio_placeholder_loc_lens
    embeds = splice_embeddings(embed(ids), host_ids, media, image_embeds=image_embeds, video_embeds=video_embeds,
                               audio_clips=[list(audio_clips)], audio_spans=[spans])
    pos, nxt = rope_index_3d(prompt.input_ids, media, prompt.image_grid_thw, prompt.video_grid_thw,
                             start=cache_start + rope_delta)
    t = len(prompt.input_ids)
    image_mask, audio_mask = router_masks(ids, media, [spans])
    has_image = bool(prompt.image_grid_thw or prompt.video_grid_thw)
    return PrefillInputs(
        inputs_embeds=embeds,
        position_ids=_to_device(pos.unsqueeze(1), device),
        cache_positions=torch.arange(cache_start, cache_start + t, device=device).unsqueeze(0),
        image_mask=image_mask if has_image else None,
        audio_mask=audio_mask if spans else None,
        rope_delta=nxt - (cache_start + t),
    )
