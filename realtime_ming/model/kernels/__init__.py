"""The model's compute kernels, one job per module, and the explicit selection of which ones run.

Model code imports from here, never the other way: these modules import only each other (and
torch / Triton), so the model's modules can depend on them without an import circle.

* `selection`: `Kernels` (frozen), the per-model choice `TRITON` / `REFERENCE`, given when a model
  is built (`select_kernels` re-selects on a loaded model: A/B benchmarks); `available()` / `interpreting()` (is Triton installed / running in its CPU interpreter);
* `norm`: RMSNorm, with the residual add fused in (`rms_norm`, `add_rms_norm`);
* `rotary`: the rotary embeddings and the fused per-head norm + rotary + layout + K/V-cache write
  (`head_rotary`);
* `swiglu`: `silu_mul` of a fused gate|up projection;
* `sdpa`: `attention_any_length`, SDPA without cuDNN's per-shape plans (not Triton, always on);
* `slot_attention`: the thinker's decode / prefill attention over its slot KV cache, read in place;
* `moe_decode`: the thinker's router and routed + shared experts for decode batches;
* `moe_experts`: the Triton MoE experts for prefill-sized batches;
* `dit_attention`, `cfm_step`: the talker's DiT attention and CFM sampler step;
* `triton_import`: Triton, or None where it is not installed.

Every kernel entry point takes `kernels=` and runs exactly the reference PyTorch math where the
selection does not apply (a CPU tensor, `REFERENCE`, Triton missing, a shape outside the kernel's
range); the kernels round where the reference rounds, so bf16 results agree to an ulp.
"""

from .selection import REFERENCE, TRITON, Kernels, available, interpreting, select_kernels

__all__ = ["REFERENCE", "TRITON", "Kernels", "available", "interpreting", "select_kernels"]
