"""FP8 experts against the fp32 / bf16 thinker on the golden fixture cases: logits error and greedy top-1 agreement.

    python -m bench.fp8_fidelity [--fixtures DIR] [--tokens 512] [--device cpu|cuda] [--out FILE.json]

For each thinker case (thinker_text, thinker_multimodal) the fp32 reference continues the case's prompt with
`--tokens` greedy tokens (its own KV-cached decode). Every variant -- fp32 with fp8 experts, bf16, bf16 with fp8
experts -- then runs the whole sequence teacher-forced in one forward and is compared with the reference position
by position: the relative L2 error of the logits (prompt and generated positions), the top-1 agreement over the
generated positions, and the first generated position where the variant's argmax differs (where its own
free-running greedy decode would leave the reference's). The bf16 row is the yardstick: what rounding the whole
model to bf16 already does to these random weights. On CUDA the variants run the Triton kernels (the FP8 ones
for fp8 experts). Writes nothing unless --out is given; prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from realtime_ming.model.kernels import REFERENCE, TRITON  # noqa: E402
from realtime_ming.model.thinker import Thinker, ThinkerKVCache, load_thinker  # noqa: E402

CASES = ("thinker_text", "thinker_multimodal")
VARIANTS = {"fp32+fp8": (torch.float32, "fp8"), "bf16": (torch.bfloat16, "model"),
            "bf16+fp8": (torch.bfloat16, "fp8")}


def case_prompt(case: dict, thinker: Thinker) -> dict:
    """The case's prompt as thinker inputs: embeds [1, T, D], positions [3, 1, T], masks, the rope delta."""
    if "inputs_embeds" in case:  # multimodal: spliced embeddings, a router per token, 3-D positions
        router = case["router_per_token"]
        return dict(embeds=case["inputs_embeds"], positions=case["position_ids"], image_mask=router == 1,
                    audio_mask=router == 2, delta=int(case["rope_deltas"].item()))
    return dict(embeds=thinker.embed(case["input_ids"]), positions=case["position_ids"], image_mask=None,
                audio_mask=None, delta=0)


@torch.no_grad()
def reference_greedy(thinker: Thinker, prompt: dict, tokens: int) -> list[int]:
    """`tokens` greedy ids after the prompt, decoded with the KV cache (text gate, position = index + delta)."""
    t = prompt["embeds"].shape[1]
    device = prompt["embeds"].device
    cache = ThinkerKVCache.allocate(thinker.cfg, 1, t + tokens + 1, device=device, dtype=prompt["embeds"].dtype)
    slots = torch.zeros(1, dtype=torch.int64, device=device)
    hidden = thinker(prompt["embeds"], prompt["positions"], cache=cache, slots=slots,
                     image_mask=prompt["image_mask"], audio_mask=prompt["audio_mask"])
    out = [int(thinker.logits(hidden[:, -1]).argmax(-1))]
    for i in range(t, t + tokens - 1):
        pos = torch.full((3, 1, 1), i + prompt["delta"], device=device)
        hidden = thinker(thinker.embed(torch.tensor([[out[-1]]], device=device)), pos, cache=cache, slots=slots,
                         cache_positions=torch.tensor([[i]], device=device))
        out.append(int(thinker.logits(hidden[:, -1]).argmax(-1)))
    return out


@torch.no_grad()
def teacher_forced_logits(thinker: Thinker, prompt: dict, generated: list[int]) -> torch.Tensor:
    """fp32 logits [T + n - 1, vocab] of prompt + generated[:-1] in one forward (no cache)."""
    device = next(thinker.parameters()).device
    dtype = thinker.model.norm.weight.dtype
    t, n = prompt["embeds"].shape[1], len(generated)
    tail = torch.tensor([generated[:-1]], device=device)
    embeds = torch.cat([prompt["embeds"].to(device, dtype), thinker.embed(tail)], dim=1)
    after = (torch.arange(t, t + n - 1, device=device) + prompt["delta"]).expand(3, 1, n - 1)
    positions = torch.cat([prompt["positions"].to(device), after], dim=2)
    masks = {}
    for key in ("image_mask", "audio_mask"):
        if prompt[key] is not None:
            masks[key] = torch.cat([prompt[key].to(device), torch.zeros(1, n - 1, dtype=torch.bool, device=device)], 1)
    return thinker.logits(thinker(embeds, positions, **masks))[0].float()


def compare(ref: torch.Tensor, got: torch.Tensor, prompt_len: int) -> dict:
    """Logits error and top-1 agreement of `got` against `ref` ([T + n - 1, vocab] each; the generated tokens are
    predicted at positions prompt_len - 1 onwards)."""
    gen = slice(prompt_len - 1, None)
    agree = ref[gen].argmax(-1) == got[gen].argmax(-1)
    differ = (~agree).nonzero()
    rel = lambda a, b: float((a.double() - b.double()).norm() / b.double().norm())  # noqa: E731
    return {"logits_rel_err_prompt": rel(got[:prompt_len], ref[:prompt_len]), "logits_rel_err_all": rel(got, ref),
            "top1_agreement": float(agree.float().mean()), "tokens": int(agree.numel()),
            "first_divergence": int(differ[0]) if len(differ) else None}


def run(fixtures: Path, tokens: int, device: str) -> dict:
    from safetensors.torch import load_file

    kernels = TRITON if device.startswith("cuda") else REFERENCE
    reference = load_thinker(fixtures, device=device, kernels=kernels).eval()
    models = {name: load_thinker(fixtures, dtype=dtype, device=device, kernels=kernels, expert_dtype=experts).eval()
              for name, (dtype, experts) in VARIANTS.items()}
    results = {}
    for name in CASES:
        case = load_file(str(fixtures / "cases" / f"{name}.safetensors"), device=device)
        prompt = case_prompt(case, reference)
        generated = reference_greedy(reference, prompt, tokens)
        ref_logits = teacher_forced_logits(reference, prompt, generated)
        t = prompt["embeds"].shape[1]
        fixture_err = float((ref_logits[:t] - case["logits"][0]).norm() / case["logits"][0].norm())
        results[name] = {"reference_vs_fixture_logits_rel_err": fixture_err, "variants": {}}
        for variant, model in models.items():
            variant_prompt = dict(prompt, embeds=case_prompt(case, model)["embeds"])
            got = teacher_forced_logits(model, variant_prompt, generated)
            results[name]["variants"][variant] = compare(ref_logits, got, t)
    return results


def table(results: dict) -> str:
    rows = ["| case | variant | logits rel err (prompt) | logits rel err (all) | top-1 agreement | first divergence |",
            "|---|---|---|---|---|---|"]
    for case, res in results.items():
        for variant, r in res["variants"].items():
            rows.append(f"| {case} | {variant} | {r['logits_rel_err_prompt']:.4f} | {r['logits_rel_err_all']:.4f} | "
                        f"{100 * r['top1_agreement']:.1f} % of {r['tokens']} | {r['first_divergence']} |")
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fixtures", type=Path, default=Path(__file__).resolve().parent.parent / "tests/fixtures/ming_tiny")
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    torch.manual_seed(0)
    results = run(args.fixtures, args.tokens, args.device)
    print(table(results))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"device": args.device, "tokens": args.tokens, "results": results}, indent=1))


if __name__ == "__main__":
    main()
