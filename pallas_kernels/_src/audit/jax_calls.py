"""JAX's own fused calls, offered to the audit as a kernel library ("jax").

Some gaps already have a fused call in JAX: a gemm -> softmax -> gemm chain
is `jax.nn.dot_product_attention`, which runs cuDNN's flash attention on a
GPU that can take it. JAX does not plug into hlo-audit itself, so this
library offers its calls through the same seam as pallas_kernels' ops (the
report then names "jax" as the source of the fix), and pallas_kernels'
`swap` puts them in (`swapped_by`). Where cuDNN cannot take a chain, the call
written is JAX's Pallas attention kernel
(`jax.experimental.pallas.ops.gpu.attention.mha`), and where neither can,
the verdict says that XLA keeps the chain. On a TPU the call is JAX's Pallas
flash attention for TPUs (`jax.experimental.pallas.ops.tpu.flash_attention`)
where its blocks fit the chain.

The rules are JAX's own (jax/_src/cudnn/fused_attention_stablehlo.py:
`check_is_flash_attention` and the dtype check of `_dot_product_attention`;
jax/experimental/pallas/ops/gpu/attention.py: `mha`'s shape checks), read
from the audited shapes and the audited device's compute capability.
"""

from __future__ import annotations

import math

from hlo_audit import plugins
from pallas_kernels._src.jax_attention import (ATTENTION, PALLAS_ATTENTION,
                                               TPU_FLASH_ATTENTION, AttentionShape,
                                               capability, cudnn_reason, pallas_reason,
                                               tpu_flash_reason)

#: The library's name: its ops are JAX's public names ("jax.nn....").
NAME = "jax"

def _shape(module, finding) -> AttentionShape | None:
  """The chain's sizes from the gemm that writes the scores (or, in the
  backward, the gradient of the probabilities: the same sizes)."""
  mm = plugins.matmul_anchor(module, finding.computation, finding.producer)
  if mm is None or mm.lhs_contracting is None:
    return None
  lhs, rhs = mm.lhs.dims, mm.rhs.dims
  lhs_free = [d for i, d in enumerate(lhs)
              if i not in mm.lhs_contracting and i not in mm.lhs_batch]
  rhs_free = [d for i, d in enumerate(rhs)
              if i not in mm.rhs_contracting and i not in mm.rhs_batch]
  queries, keys = math.prod(lhs_free), math.prod(rhs_free)
  # The softmax runs over the keys, the scores' last axis: XLA may compute
  # k @ q^T instead (a decode step's one query against the cache).
  scores = plugins.parse_array(finding.boundary_shape).dims
  if scores and scores[-1] == queries != keys:
    queries, keys = keys, queries
  return AttentionShape(
      dtype=mm.lhs.dtype, batch=tuple(lhs[i] for i in mm.lhs_batch),
      queries=queries, keys=keys,
      head_dim=math.prod(lhs[i] for i in mm.lhs_contracting))


class JaxCalls:
  """`hlo_audit.plugins.KernelLibrary` offering JAX's own fused calls."""

  name = NAME
  #: JAX's calls carry no scope of ours: nothing in the HLO to recognise.
  scope_prefix = ""
  #: pallas_kernels' swap puts these calls in.
  swapped_by = "pallas_kernels"

  def kernel_for(self, finding) -> plugins.KernelChoice:
    need = finding.need
    if need is not None and need.anchor == "attention":
      return plugins.KernelChoice(ATTENTION)
    return plugins.KernelChoice(None)

  def suggest(self, finding, module, *, device=None) -> plugins.Suggestion | None:
    if finding.kernel != ATTENTION:
      return None
    try:
      shape = _shape(module, finding)
    except (KeyError, IndexError, ValueError):
      return None  # An anchor this module does not let us read.
    if shape is None:
      return None
    arrays = shape.arrays()
    if getattr(device, "platform", "") == "tpu":
      flash = tpu_flash_reason(shape, device)
      if not flash:
        return plugins.Suggestion(
            f"{TPU_FLASH_ATTENTION}(q, k, v, causal=causal, sm_scale=scale)  # {arrays}, "
            "each transposed to [batch, heads, seq, head_dim]",
            f"kernel runs (JAX's Pallas flash attention for TPUs, Mosaic TPU: "
            f"{shape.dtype}, {shape.queries} queries, {shape.keys} keys)")
      return plugins.Suggestion(
          f'{ATTENTION}(q, k, v, implementation="xla")  # {arrays}',
          f"falls back to XLA: {flash}")
    cudnn = cudnn_reason(shape, device)
    if not cudnn:
      cc = capability(device)
      return plugins.Suggestion(
          f'{ATTENTION}(q, k, v, implementation="cudnn")  # {arrays}; scale, '
          "mask and is_causal as the model applies them",
          f"kernel runs (cuDNN flash attention on sm_{cc[0]}{cc[1]}: {shape.dtype}, "
          f"head dimension {shape.head_dim})")
    pallas = pallas_reason(shape, device)
    if not pallas:
      return plugins.Suggestion(
          f"{PALLAS_ATTENTION}(q, k, v, None, sm_scale=scale, causal=causal)  "
          f"# {arrays}; one head count for q, k and v",
          f"kernel runs (JAX's Pallas attention kernel, Triton) where cuDNN cannot: "
          f"{cudnn}")
    return plugins.Suggestion(
        f'{ATTENTION}(q, k, v, implementation="xla")  # {arrays}',
        f"falls back to XLA: {cudnn}; {pallas}")

  def sweep_targets(self):
    return {}

  def swap(self, fn, **options):
    from pallas_kernels._src.swap.rewrite import swap
    return swap(fn, **options)

  def verify(self, baseline, candidate, *args, **options):
    from pallas_kernels._src.audit.verify import verify
    return verify(baseline, candidate, *args, **options)


#: What the `hlo_audit.kernel_libraries` entry point "jax" names.
LIBRARY = JaxCalls()
