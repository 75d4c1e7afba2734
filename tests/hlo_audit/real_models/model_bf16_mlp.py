"""flax.linen MLP with a bf16 compute dtype (`nn.Dense(dtype=jnp.bfloat16)`
casts the f32 params and inputs to bf16; params stay f32), optax adamw."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from flax.training import train_state

BATCH, DIM, HIDDEN, MID, OUT = 64, 128, 512, 384, 128


class MLP(nn.Module):
  @nn.compact
  def __call__(self, x):
    h = nn.Dense(HIDDEN, dtype=jnp.bfloat16)(x)  # <up>
    h = nn.relu(h)  # <relu>
    h = nn.Dense(MID, dtype=jnp.bfloat16)(h)  # <mid>
    h = nn.relu(h)  # <relu2>
    return nn.Dense(OUT, dtype=jnp.bfloat16)(h)  # <down>


def train_step(state, x, y):
  def loss_fn(params):
    pred = state.apply_fn({"params": params}, x)  # <apply>
    return jnp.mean((pred.astype(jnp.float32) - y) ** 2)  # <loss>
  loss, grads = jax.value_and_grad(loss_fn)(state.params)  # <grad>
  return state.apply_gradients(grads=grads), loss  # <update>


def build():
  model = MLP()
  x = jnp.zeros((BATCH, DIM), jnp.float32)
  params = model.init(jax.random.key(0), x)["params"]
  state = train_state.TrainState.create(apply_fn=model.apply, params=params,
                                        tx=optax.adamw(1e-3))
  return jax.jit(train_step), (state, x, jnp.zeros((BATCH, OUT)))


# ------------------------------------------------------------ ground truth --
# Read off the optimized CPU HLO. XLA differs by version (truth.NATIVE_BF16_DOT):
# jax 0.10 upcasts every bf16 dot operand back to f32, so each f32 param is
# rounded to bf16 and widened again (`convert_convert_fusion`: f32 -> bf16 ->
# f32) before an f32 dot; from 0.11 the dots run in bf16 and each param is
# cast once (`wrapped_convert`: f32 -> bf16). Either way the casts are
# standalone kernels feeding dots: unfused prologues, never layout changes,
# and the f32 -> bf16 -> f32 rounding is the user's requested precision, not
# a removable round trip. Weight gradients come out of f32 dots and are cast
# to bf16 in a kernel of their own (an epilogue).
from hlo_audit import FindingKind as K  # noqa: E402
from tests.hlo_audit.real_models.truth import (NATIVE_BF16_DOT, Expect, per_version,  # noqa: E402
                                               ModelTruth, NotFlagged)

_W = "bf16" if NATIVE_BF16_DOT else "f32"  # dtype the dots read and write
_SZ = 2 if NATIVE_BF16_DOT else 4
_PARAMS = (("up", DIM, HIDDEN), ("mid", HIDDEN, MID), ("down", MID, OUT))

# From 0.11 each relu is computed twice: in bf16 for the next forward dot, in
# f32 (with the convert) for the weight-gradient dot; 0.10 computes it once.
_RELU_DTYPES = (_W, "f32") if NATIVE_BF16_DOT else (_W,)

TRUTH = ModelTruth(
    expect=tuple(
        Expect(K.UNFUSED_PROLOGUE, f"{_W}[{a},{b}]", m, why=(
            f"the {m} param's bf16 cast is its own kernel, read only by dots"))
        for m, a, b in _PARAMS) + tuple(
        Expect(K.UNFUSED_PROLOGUE, f"{dt}[{BATCH},{n}]", m, why=(
            "relu (and cast) written only for a dot"))
        for m, n in (("relu", HIDDEN), ("relu2", MID)) for dt in _RELU_DTYPES) + (
        Expect(K.UNFUSED_PROLOGUE, f"{_W}[{BATCH},{DIM}]", "up",
               why="x cast to bf16 feeding the first dot"),
        Expect(K.UNFUSED_EPILOGUE, f"{_W}[{BATCH},{HIDDEN}]", "up",
               bytes=2 * BATCH * HIDDEN * _SZ, why="x @ W0 read once by bias + cast"),
        Expect(K.UNFUSED_EPILOGUE, f"{_W}[{BATCH},{MID}]", "mid",
               bytes=2 * BATCH * MID * _SZ, why="h @ W1 read once by bias + cast"),
        Expect(K.UNFUSED_EPILOGUE, f"{_W}[{BATCH},{OUT}]", "down",
               bytes=2 * BATCH * OUT * _SZ, why="h2 @ W2 read once by bias + cast + (pred - y)"),
        Expect(K.UNFUSED_EPILOGUE, f"{_W}[{BATCH},{MID}]", "down",
               bytes=2 * BATCH * MID * _SZ, why="dpred @ W2^T read once by the relu-backward select"),
        Expect(K.UNFUSED_EPILOGUE, f"{_W}[{BATCH},{HIDDEN}]", "mid",
               bytes=2 * BATCH * HIDDEN * _SZ, why="dz @ W1^T read once by the relu-backward select"),
        Expect(K.UNFUSED_EPILOGUE, f"f32[{MID},{HIDDEN}]", "mid",
               bytes=2 * MID * HIDDEN * 4, why="dW1 (f32 dot) read once by its bf16 cast"),
        Expect(K.UNFUSED_EPILOGUE, f"f32[{HIDDEN},{DIM}]", "up",
               bytes=2 * HIDDEN * DIM * 4, why="dW0 read once by its bf16 cast"),
        Expect(K.UNFUSED_EPILOGUE, f"f32[{OUT},{MID}]", "down",
               bytes=2 * OUT * MID * 4, why="dW2 read once by its bf16 cast"),
        Expect(K.SEPARATE_REDUCTION, f"f32[{BATCH},{OUT}]", "loss",
               why="pred - y re-read by the squared-error sum"),
        # Judged with the suite's every-finding rule (read off the HLO):
        Expect(K.SEPARATE_REDUCTION, "f32[64,128]", "loss", says="column_reduction", count=per_version(1, 0, 0), why=(
            "a backward term re-read by a bias or gamma gradient reduce over the leading axes")),
        Expect(K.SEPARATE_REDUCTION, "f32[64,384]", "relu2", says="column_reduction", count=per_version(1, 0, 0), why=(
            "a backward term re-read by a bias or gamma gradient reduce over the leading axes")),
        Expect(K.SEPARATE_REDUCTION, "f32[64,512]", "relu", says="column_reduction", why=(
            "a backward term re-read by a bias or gamma gradient reduce over the leading axes")),
        Expect(K.STANDALONE_COPY, "bf16[128,384]", "down", count=per_version(0, 1, 1), why=(
            "a dtype conversion kernel of its own read by elementwise kernels (a cast of the weights or of a matmul result)")),
        Expect(K.STANDALONE_COPY, "bf16[128,384]", "update", count=per_version(1, 0, 0), why=(
            "a dtype conversion kernel of its own read by elementwise kernels (a cast of the weights or of a matmul result)")),
        Expect(K.STANDALONE_COPY, "bf16[384,512]", "mid", count=per_version(0, 1, 1), why=(
            "a dtype conversion kernel of its own read by elementwise kernels (a cast of the weights or of a matmul result)")),
        Expect(K.STANDALONE_COPY, "bf16[384,512]", "update", count=per_version(1, 0, 0), why=(
            "a dtype conversion kernel of its own read by elementwise kernels (a cast of the weights or of a matmul result)")),
        Expect(K.STANDALONE_COPY, "bf16[512,128]", "up", count=per_version(0, 1, 1), why=(
            "a dtype conversion kernel of its own read by elementwise kernels (a cast of the weights or of a matmul result)")),
        Expect(K.STANDALONE_COPY, "bf16[512,128]", "update", count=per_version(1, 0, 0), why=(
            "a dtype conversion kernel of its own read by elementwise kernels (a cast of the weights or of a matmul result)")),
        Expect(K.STANDALONE_COPY, "f32[64,128]", "down", count=per_version(0, 1, 1), why=(
            "a dtype conversion kernel of its own read by elementwise kernels (a cast of the weights or of a matmul result)")),
        Expect(K.STANDALONE_COPY, "f32[64,384]", "mid", count=per_version(0, 1, 1), why=(
            "a dtype conversion kernel of its own read by elementwise kernels (a cast of the weights or of a matmul result)")),
        Expect(K.UNDONATED_ARGUMENT, None, "update", says="donat", why=(
            "the step returns this state updated but does not donate it: each leaf's output could reuse its buffer")),
        Expect(K.UNFUSED_PROLOGUE, "f32[64,128]", "up", count=per_version(0, 1, 1), why=(
            "a cast written only for the matmul that reads it")),
    ),
    not_flagged=tuple(
        NotFlagged(f"the {m} param's cast feeds a dot: a prologue, not a standalone "
                   "copy to remove (and f32 -> bf16 -> f32 is a rounding)",
                   kind=K.STANDALONE_COPY, shape=f"{_W}[{a},{b}]", marker=m)
        for m, a, b in _PARAMS) + (
        NotFlagged("converts are no layout change: no transpose or copy in "
                   "this HLO", kind=K.LAYOUT_CONFLICT),
        NotFlagged("a narrowing round trip (f32 -> bf16 -> f32) is not bit-exact "
                   "to remove", evidence="converted back", numerical="EXACT"),
    ),
)

# ------------------------------------------------------- ground truth, H200 --
# Read off XLA:GPU's optimized HLO for an H200 (h200/bf16_mlp.hlo.gz, jax
# 0.12). The dots run in bf16 on cast params (each cast a kernel of its own,
# read only by gemms); the first forward dot writes bf16 for a bias kernel,
# the others are split-K with bias, relu and casts in their sums; the weight
# gradients come out of the gemms in bf16 and are read by adamw fusions that
# widen them and write the parameter and both moments.
TRUTH_H200 = ModelTruth(
    expect=tuple(
        Expect(K.UNFUSED_PROLOGUE, f"bf16[{a},{b}]", m, says="cast", why=(
            f"the {m} param's bf16 cast is its own kernel, read only by gemms"))
        for m, a, b in _PARAMS) + tuple(
        Expect(K.UNFUSED_EPILOGUE, f"bf16[{a},{b}]", m, says="outputs:3", why=(
            f"the {m} weight gradient (bf16 out of the gemm) read once by the adamw "
            "fusion that widens it and writes the parameter and both moments"))
        for m, a, b in _PARAMS) + (
        Expect(K.UNFUSED_PROLOGUE, f"bf16[{BATCH},{DIM}]", "up", says="cast",
               why="x cast to bf16 for the first gemm and its weight-gradient gemm"),
        Expect(K.UNFUSED_EPILOGUE, f"bf16[{BATCH},{HIDDEN}]", "up", says="bias",
               bytes=2 * BATCH * HIDDEN * 2, why="x @ W0 read once by the bias add"),
        Expect(K.SEPARATE_REDUCTION, f"bf16[{BATCH},{HIDDEN}]", "relu",
               says="column_reduction", why=(
                   "relu-backward dz re-read by the bias-gradient reduce")),
        Expect(K.SEPARATE_REDUCTION, f"bf16[{BATCH},{MID}]", "relu2",
               says="column_reduction", why=(
                   "relu2-backward dz re-read by the bias-gradient reduce")),
        Expect(K.SEPARATE_REDUCTION, f"f32[{BATCH},{OUT}]", "loss", why=(
            "pred - y (the last gemm's split-K sum with bias, in f32) re-read by "
            "the squared-error sum and the bias-gradient reduce")),
        Expect(K.UNDONATED_ARGUMENT, None, "update", says="donat", why=(
            "the step returns this state updated but does not donate it")),
    ),
    not_flagged=(
        NotFlagged("a matmul kernel that only casts its result leaves the adamw "
                   "update reading it", says="pallas_kernels.matmul",
                   kind=K.UNFUSED_EPILOGUE, shape=f"bf16[{HIDDEN},{MID}]"),
        NotFlagged("converts are no layout change", kind=K.LAYOUT_CONFLICT),
        NotFlagged("a narrowing round trip (f32 -> bf16 -> f32) is not bit-exact "
                   "to remove", evidence="converted back", numerical="EXACT"),
    ),
)
