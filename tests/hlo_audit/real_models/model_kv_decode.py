"""One decode step of a grouped-query-attention transformer with a KV cache,
written in plain JAX the way a user writes a generation loop: bf16 params
and activations, RMSNorm, rotary embeddings at the current position, the new
token's keys and values written into the cache with
`jax.lax.dynamic_update_slice` at `pos`, a SwiGLU MLP, logits for the next
token, and the cache donated to the jitted step so XLA can update it in
place (the cache is [layers, batch, max_len, kv_heads, head_dim], the
layout a user stores it in, one token written per step)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

LAYERS, BATCH, MAX_LEN = 2, 4, 256
D_MODEL, HEADS, KV_HEADS, HEAD_DIM, HIDDEN, VOCAB = 256, 8, 2, 32, 512, 1024
GROUP = HEADS // KV_HEADS
DTYPE = jnp.bfloat16


def rms_norm(x, gamma, eps=1e-6):
  x32 = x.astype(jnp.float32)
  x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)  # <rms>
  return (x32 * gamma).astype(DTYPE)  # <rms_scale>


def rope(x, pos):
  """Rotates pairs (x[..., :half], x[..., half:]) by pos * theta_i."""
  half = HEAD_DIM // 2
  freqs = 1.0 / (10000.0 ** (jnp.arange(half, dtype=jnp.float32) / half))
  angle = pos.astype(jnp.float32) * freqs  # <rope_angle>
  cos, sin = jnp.cos(angle), jnp.sin(angle)
  x1, x2 = x[..., :half].astype(jnp.float32), x[..., half:].astype(jnp.float32)
  return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(DTYPE)  # <rope>


def attention(p, h, k_cache, v_cache, layer, pos):
  q = (h @ p["wq"]).reshape(BATCH, HEADS, HEAD_DIM)  # <q_proj>
  k = (h @ p["wk"]).reshape(BATCH, KV_HEADS, HEAD_DIM)  # <k_proj>
  v = (h @ p["wv"]).reshape(BATCH, KV_HEADS, HEAD_DIM)  # <v_proj>
  q, k = rope(q, pos), rope(k, pos)  # <rope_qk>
  at = (layer, 0, pos, 0, 0)  # this token's keys and values go to `pos` of this layer
  k_cache = jax.lax.dynamic_update_slice(k_cache, k[None, :, None], at)  # <k_update>
  v_cache = jax.lax.dynamic_update_slice(v_cache, v[None, :, None], at)  # <v_update>
  keys, values = k_cache[layer], v_cache[layer]  # <cache_read>
  qg = q.reshape(BATCH, KV_HEADS, GROUP, HEAD_DIM)
  scores = jnp.einsum("bhgd,bthd->bhgt", qg, keys,  # <scores>
                      preferred_element_type=jnp.float32) / jnp.sqrt(HEAD_DIM)
  valid = jnp.arange(MAX_LEN) <= pos  # <mask>
  scores = jnp.where(valid, scores, -1e30)  # <masked>
  probs = jax.nn.softmax(scores, axis=-1).astype(DTYPE)  # <softmax>
  out = jnp.einsum("bhgt,bthd->bhgd", probs, values)  # <pv>
  return out.reshape(BATCH, D_MODEL) @ p["wo"], k_cache, v_cache  # <o_proj>


def mlp(p, h):
  return (jax.nn.silu(h @ p["w_gate"]) * (h @ p["w_up"])) @ p["w_down"]  # <swiglu>


def decode_step(params, cache, tokens, pos):
  """Logits for the token after `tokens` (one per sequence, at `pos`), and
  the cache holding this step's keys and values."""
  k_cache, v_cache = cache["k"], cache["v"]
  x = params["embed"][tokens]  # <embed>
  for layer, p in enumerate(params["layers"]):
    a, k_cache, v_cache = attention(p, rms_norm(x, p["attn_norm"]), k_cache, v_cache,  # <attn>
                                    layer, pos)
    x = x + a  # <attn_residual>
    x = x + mlp(p, rms_norm(x, p["mlp_norm"]))  # <mlp>
  logits = rms_norm(x, params["final_norm"]) @ params["unembed"]  # <logits>
  return logits.astype(jnp.float32), {"k": k_cache, "v": v_cache}  # <out>


def init_params(key):
  keys = iter(jax.random.split(key, 2 + 7 * LAYERS))

  def dense(n_in, n_out):
    return (jax.random.normal(next(keys), (n_in, n_out)) / jnp.sqrt(n_in)).astype(DTYPE)

  layers = [{
      "attn_norm": jnp.ones((D_MODEL,), jnp.float32),
      "wq": dense(D_MODEL, HEADS * HEAD_DIM),
      "wk": dense(D_MODEL, KV_HEADS * HEAD_DIM),
      "wv": dense(D_MODEL, KV_HEADS * HEAD_DIM),
      "wo": dense(HEADS * HEAD_DIM, D_MODEL),
      "mlp_norm": jnp.ones((D_MODEL,), jnp.float32),
      "w_gate": dense(D_MODEL, HIDDEN),
      "w_up": dense(D_MODEL, HIDDEN),
      "w_down": dense(HIDDEN, D_MODEL),
  } for _ in range(LAYERS)]
  return {"embed": dense(VOCAB, D_MODEL), "layers": layers,
          "final_norm": jnp.ones((D_MODEL,), jnp.float32),
          "unembed": dense(D_MODEL, VOCAB)}


def build():
  params = init_params(jax.random.key(0))
  shape = (LAYERS, BATCH, MAX_LEN, KV_HEADS, HEAD_DIM)
  cache = {"k": jnp.zeros(shape, DTYPE), "v": jnp.zeros(shape, DTYPE)}
  tokens = jnp.zeros((BATCH,), jnp.int32)
  decode = jax.jit(decode_step, donate_argnums=(1,))  # <donate>
  return decode, (params, cache, tokens, jnp.int32(7))


# ------------------------------------------------------------ ground truth --
# Read off the optimized CPU HLO (jax 0.10.2, 0.11.2 and 0.12.0.1 compiled
# here; the differences are named where they occur). Per layer: the norm's
# sum of squares is a kernel of its own (x * x written, then a two-stage
# reduce), its apply writes h; q, k and v are three library dots; k's rotary
# embedding runs inside the kernel writing it into the cache at `pos`; the
# layer's keys and values are cut out of the cache and transposed
# ([b, t, h, d] -> [b, h, d, t] for q @ k^T, [b, h, t, d] for p @ v) by a
# kernel each, every step, before the two attention dots; the softmax is
# scale + mask, max + exp, sum, 1/sum, normalize, each a kernel; o_proj's and
# w_down's results are read back by the residual add; SwiGLU is one kernel
# reading both the gate and the up dots.
#
# By version: jax 0.10 widens every bf16 dot operand to f32 (each weight cast
# to f32 by a kernel of its own, dot results f32 and rounded to bf16 by their
# readers), and its cache update converts the whole cache to f32, updates
# it and converts it back (`dynamic-update-slice_convert_fusion*`: the
# update is not in place, O(cache) per layer and token). From 0.11 the dots
# run in bf16 and the update is a dynamic-update-slice fusion on the
# donated buffer, in place. q's rotary embedding is one kernel reading the
# q dot in 0.10 and 0.11; 0.12 splits it into the two rotated halves, a
# concatenate and a cast, each a kernel.
from hlo_audit import FindingKind as K  # noqa: E402
from tests.hlo_audit.real_models.truth import (NATIVE_BF16_DOT, Expect,  # noqa: E402
                                               ModelTruth, NotFlagged, per_version)

_W = "bf16" if NATIVE_BF16_DOT else "f32"  # what the projections write
_SCORES = f"f32[{BATCH},{KV_HEADS},{GROUP},{MAX_LEN}]"
_X = f"{_W}[{BATCH},{D_MODEL}]"
_CAST = f"cast:{'f32' if NATIVE_BF16_DOT else 'bf16'}"  # what a dot's reader rounds to
_CACHE = f"bf16[{LAYERS},{BATCH},{MAX_LEN},{KV_HEADS},{HEAD_DIM}]"

# jax 0.10: each bf16 weight widened to f32 by a kernel read only by its dot.
_WEIGHT_CASTS = () if NATIVE_BF16_DOT else tuple(
    Expect(K.UNFUSED_PROLOGUE, f"f32[{a},{b}]", m, says="cast", count=n, why=(
        "a bf16 weight widened to f32 by a kernel of its own, read only by its "
        "dot (jax 0.10 runs bf16 dots in f32)"))
    for m, a, b, n in (("q_proj", D_MODEL, HEADS * HEAD_DIM, LAYERS),
                       ("k_proj", D_MODEL, KV_HEADS * HEAD_DIM, LAYERS),
                       ("v_proj", D_MODEL, KV_HEADS * HEAD_DIM, LAYERS),
                       ("o_proj", HEADS * HEAD_DIM, D_MODEL, LAYERS),
                       ("swiglu", D_MODEL, HIDDEN, 2 * LAYERS),
                       ("swiglu", HIDDEN, D_MODEL, LAYERS),
                       ("logits", D_MODEL, VOCAB, 1)))

TRUTH = ModelTruth(
    expect=_WEIGHT_CASTS + (
        Expect(K.UNFUSED_EPILOGUE, _SCORES, "scores", says="mask", count=LAYERS, why=(
            "q @ k^T read once by the kernel scaling it by 1/sqrt(d) and masking "
            "the positions past `pos`")),
        Expect(K.UNFUSED_EPILOGUE, _X, "q_proj", count=LAYERS, why=(
            "q read only by its rotary embedding: one kernel in 0.10 and 0.11 "
            "(missed there: the kernel slices and concatenates), the two rotated "
            "halves' kernels in 0.12 (outputs:2); the rotation is same-row work "
            "the dot's store could do")),
        Expect(K.UNFUSED_EPILOGUE, _X, "o_proj", says="residual", count=LAYERS, why=(
            "attn @ w_o read once by the residual add (the embedding rows for "
            "layer 0, the residual stream for layer 1)")),
        Expect(K.UNFUSED_EPILOGUE, _X, "swiglu", says="residual", count=LAYERS, why=(
            "(silu(gate) * up) @ w_down read once by the residual add")),
        Expect(K.UNFUSED_EPILOGUE, f"{_W}[{BATCH},{HIDDEN}]", "swiglu", says="glu",
               count=2 * LAYERS, why=(
                   "h @ w_gate and h @ w_up, each read once by the SwiGLU kernel: "
                   "silu(gate) (1 / (1 + exp(-x)) computed in f32) times up, two "
                   "gemms of the same h: a GLU kernel writes only the product")),
        Expect(K.UNFUSED_EPILOGUE, f"bf16[{BATCH},{VOCAB}]", "logits", says="cast:f32",
               count=per_version(0, 1, 1), why=(
                   "the unembedding's bf16 logits read once by the cast to f32 the "
                   "step returns (0.10's dot writes f32 itself)")),
        Expect(K.UNFUSED_EPILOGUE, f"f32[{BATCH},{KV_HEADS},{GROUP},{HEAD_DIM}]", "pv",
               says="cast:bf16", count=per_version(LAYERS, 0, 0), why=(
                   "0.10: p @ v in f32 read once by its rounding to bf16 (and back) "
                   "for w_o's dot")),
        Expect(K.UNFUSED_PROLOGUE, f"{_W}[{BATCH},{KV_HEADS},{GROUP},{MAX_LEN}]", "softmax",
               says="scale", count=LAYERS, why=(
                   "the softmax's normalization exp(s - max) * (1 / sum), cast to "
                   "bf16, written only for p @ v")),
        Expect(K.UNFUSED_PROLOGUE, _X, None if not NATIVE_BF16_DOT else "rms_scale",
               says="scale", count=per_version(2 * LAYERS + 1, 1, 1), why=(
                   "RMSNorm's apply x * rsqrt(mean(x^2) + eps) * gamma, cast to bf16, "
                   "written only for the dots reading it: from 0.11 only the final "
                   "norm's (one reader) saves anything, each other norm's readers "
                   "would re-read more than the buffer (rule 4); 0.10's f32 "
                   "buffers are twice as large, so all five are worth fusing")),
        Expect(K.UNFUSED_PROLOGUE, f"bf16[{BATCH},{KV_HEADS},{GROUP},{HEAD_DIM}]", "rope",
               says="cast", count=per_version(0, 0, LAYERS), why=(
                   "0.12: the rotated q cast to bf16 by a kernel of its own, read "
                   "only by q @ k^T")),
        Expect(K.MATERIALIZED_SLICE, f"f32[{BATCH},{HEADS},{HEAD_DIM}]", "rope",
               says="concatenate", count=per_version(0, 0, LAYERS), why=(
                   "0.12: the two rotated halves of q joined by a concatenate kernel "
                   "read only by the cast (the halves themselves are written by two "
                   "kernels for it)")),
        Expect(K.SEPARATE_REDUCTION, _SCORES, "masked", says="softmax", count=LAYERS, why=(
            "the scaled, masked scores written and re-read by the max (+ exp) "
            "kernel")),
        Expect(K.SEPARATE_REDUCTION, _SCORES, "softmax", says="softmax", count=LAYERS, why=(
            "exp(s - max) re-read by the sum and by the normalization")),
        Expect(K.SEPARATE_REDUCTION, f"f32[{BATCH},{D_MODEL}]", "rms", says="rms_norm",
               count=2 * LAYERS + 1, why=(
                   "x * x written by a kernel of its own and re-read by the "
                   "mean's reduce (two norms a layer and the final one)")),
        Expect((K.LAYOUT_CONFLICT, K.UNFUSED_PROLOGUE),
               f"bf16[{BATCH},{KV_HEADS},{HEAD_DIM},{MAX_LEN}]", "cache_read",
               says="transpose", count=LAYERS, why=(
                   "the layer's whole key cache cut out and transposed "
                   "[b, t, h, d] -> [b, h, d, t] by a kernel (transpose_copy_fusion.3, "
                   ".1) only for q @ k^T, every step: O(cache) written per token; a "
                   "heads-major cache ([layers, batch, kv_heads, len, dim]) or a dot "
                   "reading the cache's layout removes it")),
        Expect((K.LAYOUT_CONFLICT, K.UNFUSED_PROLOGUE),
               f"{_W}[{BATCH},{KV_HEADS},{MAX_LEN},{HEAD_DIM}]", "cache_read",
               says="transpose", count=LAYERS, why=(
                   "the layer's value cache transposed [b, t, h, d] -> "
                   "[b, h, t, d] (and widened to f32 in 0.10) by a kernel "
                   "(transpose_copy_fusion.2, transpose_copy_fusion) only for p @ v")),
        Expect(K.LOST_IN_PLACE, _CACHE, None, says="in-place", count=per_version(2, 0, 0),
               why=(
            "0.10, one per donated cache (k, v): each cache update (dynamic-update-"
            "slice_convert_fusion.3 then .1 for k, .2 then the last for v) converts "
            "the whole donated cache to f32, writes the token's row and converts it "
            "all back: the in-place update the donation was for is lost, O(cache) "
            "per layer and token (0.11 and later update it in place)")),
    ),
    not_flagged=(
        NotFlagged("the SwiGLU kernel computes silu(gate) * up, not a cast: a matmul "
                   "that only casts its result leaves that kernel reading it (silu "
                   "is missed because XLA rounds each of its steps to bf16)",
                   kind=K.UNFUSED_EPILOGUE, shape=f"{_W}[{BATCH},{HIDDEN}]",
                   evidence=f"apply {_CAST};"),
        NotFlagged("layer 0's reader adds the embedding rows (the residual) too: a "
                   "matmul that only casts its result does not cover it",
                   kind=K.UNFUSED_EPILOGUE, marker="o_proj", evidence=f"apply {_CAST};"),
        NotFlagged("RMSNorm's apply multiplies by rsqrt(mean(x^2)) and gamma before "
                   "the cast: not a cast alone (a matmul casting on load would drop "
                   "the normalization)", kind=K.UNFUSED_PROLOGUE, shape=_X, evidence="(cast)"),
        NotFlagged("the softmax's normalization multiplies exp(s - max) by 1 / sum "
                   "before the cast: not a cast alone", kind=K.UNFUSED_PROLOGUE,
                   shape=f"{_W}[{BATCH},{KV_HEADS},{GROUP},{MAX_LEN}]", evidence="(cast)"),
        NotFlagged("the f32 logits are the step's output, written whatever happens: "
                   "what the cast's fusion removes is the bf16 result before it (the "
                   "unembedding's epilogue)", kind=K.STANDALONE_COPY,
                   evidence="read by the program's output"),
        NotFlagged("RMSNorm, no LayerNorm", says="layer_norm"),
    ),
)

# ------------------------------------------------------- ground truth, H200 --
# Read off XLA:GPU's optimized HLO for an H200 (h200/kv_decode.hlo.gz, jax
# 0.12). Each norm is one Triton kernel (statistics and apply); q, k and v
# are one gemm ([4, 384]); the residual adds run in the o_proj and w_down
# gemms; gate and up are one gemm ([4, 1024]) read by the SwiGLU kernel;
# attention is q @ k^T -> XLA's Triton softmax -> p @ v per layer. The
# donated caches are not updated in place: the key cache is transposed whole
# to [l, b, h, d, t] (wrapped_transpose), each layer's keys cut out of that
# copy with the new token inserted (loop_slice_fusion.1, loop_slice_fusion),
# and the whole cache transposed back with both layers' tokens
# (input_transpose_fusion); the value cache is copied whole (copy.6: the
# output aliasing the argument is written by a kernel that transposes), each
# layer's values cut out transposed (loop_slice_fusion.3, .2), and the whole
# cache written again (loop_transpose_fusion). Every token rewrites both
# caches: O(cache) where the donation was for O(token).
TRUTH_H200 = ModelTruth(
    expect=(
        Expect(K.SEPARATE_REDUCTION, f"f32[{BATCH * KV_HEADS},{GROUP},{MAX_LEN}]", "scores",
               says="dot_product_attention", count=LAYERS, why=(
                   "q @ k^T written, the Triton softmax writes p, p @ v reads it: "
                   "gemm -> softmax -> gemm, which a fused attention kernel keeps "
                   "on chip")),
        Expect(K.STANDALONE_COPY, _CACHE, None, says="aliasing copy", why=(
            "copy.6: the donated value cache copied whole before "
            "loop_transpose_fusion writes the aliased output")),
        Expect((K.STANDALONE_COPY, K.LAYOUT_CONFLICT),
               f"bf16[{LAYERS},{BATCH},{KV_HEADS},{HEAD_DIM},{MAX_LEN}]", None, why=(
                   "wrapped_transpose: the whole key cache transposed, read by the "
                   "per-layer slices and by the transpose back")),
        Expect(K.UNFUSED_EPILOGUE, f"bf16[{BATCH},{2 * HIDDEN}]", "swiglu", says="glu",
               count=LAYERS, why=(
                   "x @ [w_gate | w_up] read once by the SwiGLU kernel (silu of the "
                   "first half, computed in f32 and rounded back, times the second): "
                   "a GLU kernel writes only the product")),
        Expect(K.LOST_IN_PLACE, _CACHE, None, says="in-place", count=2, why=(
            "each donated cache (k, v) is rewritten whole every token "
            "(input_transpose_fusion, loop_transpose_fusion write "
            f"{_CACHE} from a transposed or copied cache) where a "
            "dynamic-update-slice of one row per layer was asked for: the in-place "
            "update the donation was for is lost (O(cache) per token), because "
            "the cache's [b, t, h, d] layout is not the one the attention gemms "
            "read")),
        Expect((K.LAYOUT_CONFLICT, K.MATERIALIZED_SLICE, K.UNFUSED_PROLOGUE),
               f"bf16[1,{BATCH},{KV_HEADS},{HEAD_DIM},{MAX_LEN}]", "cache_read",
               count=LAYERS, why=(
                   "MISSED: loop_slice_fusion.1 and loop_slice_fusion write the "
                   "layer's keys, transposed, with the new token inserted, only for "
                   "q @ k^T")),
        Expect((K.LAYOUT_CONFLICT, K.MATERIALIZED_SLICE, K.UNFUSED_PROLOGUE),
               f"bf16[1,{BATCH},{KV_HEADS},{MAX_LEN},{HEAD_DIM}]", "cache_read",
               count=LAYERS, why=(
                   "MISSED: loop_slice_fusion.3 and .2 write the layer's values, "
                   "transposed, with the new token inserted, only for p @ v")),
    ),
    not_flagged=(
        NotFlagged("x + attn @ w_o (or + mlp) -> XLA's Triton RMSNorm -> the next "
                   "gemm is no attention: the middle kernel is a norm over the "
                   "features, and the second gemm contracts over the features, not "
                   "over the first gemm's output positions",
                   says="attention", shape=f"bf16[{BATCH},{D_MODEL}]"),
        NotFlagged("the SwiGLU kernel computes silu(gate) * up from the gemm's two "
                   "halves, not a cast", kind=K.UNFUSED_EPILOGUE,
                   shape=f"bf16[{BATCH},{2 * HIDDEN}]", evidence="apply slice, cast:f32"),
        NotFlagged("past q's rotary embedding the qkv gemm's readers rebuild whole "
                   "caches (per-layer slices, both caches written back) in which the "
                   "new keys and values are one row of 256: no epilogue writes them; "
                   "what removes them is the cache updated in place",
                   kind=K.UNFUSED_EPILOGUE, shape=f"bf16[{BATCH},{(HEADS + 2 * KV_HEADS) * HEAD_DIM}]",
                   says="outputs:"),
        NotFlagged("XLA's Triton RMSNorm is one kernel", says="pallas_kernels.rms_norm"),
        NotFlagged("RMSNorm, no LayerNorm", says="layer_norm"),
    ),
)
