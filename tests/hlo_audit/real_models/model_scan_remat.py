"""flax.linen residual MLP stack as nn.scan over nn.remat'd layers (the
pattern of flax's "scan over layers" guide), SGD with momentum from optax."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

BATCH, DIM, LAYERS = 64, 128, 4


class Layer(nn.Module):
  @nn.compact
  def __call__(self, x, _):
    h = nn.Dense(DIM)(x)  # <layer_dense>
    x = x + jnp.tanh(h)  # <layer_act>
    return x, None


class Stack(nn.Module):
  @nn.compact
  def __call__(self, x):
    ScanLayer = nn.scan(nn.remat(Layer), variable_axes={"params": 0},  # <scan>
                        split_rngs={"params": True}, length=LAYERS)
    x, _ = ScanLayer()(x, None)  # <stack>
    return nn.Dense(1)(x)  # <out>


model = Stack()
tx = optax.sgd(1e-2, momentum=0.9)


def train_step(params, opt_state, x, y):
  def loss_fn(params):
    pred = model.apply({"params": params}, x)  # <apply>
    return jnp.mean((pred - y) ** 2)
  loss, grads = jax.value_and_grad(loss_fn)(params)  # <grad>
  updates, opt_state = tx.update(grads, opt_state, params)  # <optax>
  return optax.apply_updates(params, updates), opt_state, loss  # <apply_updates>


def build():
  x = jnp.zeros((BATCH, DIM), jnp.float32)
  params = model.init(jax.random.key(0), x)["params"]
  return jax.jit(train_step), (params, tx.init(params), x, jnp.zeros((BATCH, 1)))


# ------------------------------------------------------------ ground truth --
# Read off the optimized CPU HLO (jax 0.10.2, 0.11.2, 0.12: the same kernels).
# Forward: a while loop (trip 4) that copies its carry x at the top of the
# body, dynamic-slices the layer's weight into its own buffer for the dot,
# and stores x into the residual stack in place (dynamic-update-slice into a
# zero broadcast made at entry). Backward: a while loop (trip 4) that slices
# weight and saved input, recomputes the forward dot (remat), and writes dW
# into a zero-initialised gradient stack. Entry copies x into the loop state.
from hlo_audit import FindingKind as K  # noqa: E402
from tests.hlo_audit.real_models.truth import per_version, Expect, ModelTruth, NotFlagged  # noqa: E402

_X = f"f32[{BATCH},{DIM}]"
_W = f"f32[{DIM},{DIM}]"
_PER_RUN = 2 * BATCH * DIM * 4 * LAYERS  # a write and a read of x, 4 trips

TRUTH = ModelTruth(
    expect=(
        Expect(K.STANDALONE_COPY, _X, "stack", says="loop", why=(
            "copy of the loop carry x at the top of the forward body (4 trips): "
            "a loop-boundary copy, not a layout change")),
        Expect(K.STANDALONE_COPY, _X, None, says="loop", why=(
            "entry copy(x) into the forward loop's initial state")),
        Expect((K.UNFUSED_PROLOGUE, K.STANDALONE_COPY), _W, "stack", count=2, says="dynamic-slice", why=(
            "per-layer weight dynamic-sliced into its own buffer each trip, read "
            "only by the layer's dots (forward; backward remat + dX)")),
        Expect((K.UNFUSED_PROLOGUE, K.STANDALONE_COPY), _X, "stack", says="dynamic-slice", why=(
            "saved layer input dynamic-sliced out of the residual stack each "
            "backward trip for the remat dot and the dW dot")),
        Expect(K.UNFUSED_EPILOGUE, _X, "layer_dense", count=3, bytes=_PER_RUN, why=(
            "forward x @ W -> bias+tanh+residual; remat x @ W -> tanh backward; "
            "dz @ W^T -> residual add: each read once, in a 4-trip loop")),
        Expect(K.UNFUSED_EPILOGUE, _W, "layer_dense", why=(
            "per-layer dW dot written, then copied into the gradient stack by a "
            "dynamic-update-slice: the dot could write the slice")),
        Expect(K.SEPARATE_REDUCTION, _X, "layer_act", bytes=_PER_RUN // 2, why=(
            "tanh-backward dz re-read by the bias-gradient reduce each trip")),
        # Judged with the suite's every-finding rule (read off the HLO):
        Expect(K.MATERIALIZED_SLICE, "f32[128]", "stack", count=per_version(0, 1, 1), why=(
            "one layer's bias sliced out of the scanned stack into a buffer for one reader")),
        Expect(K.UNDONATED_ARGUMENT, None, "apply_updates", says="donat", why=(
            "the step returns this state updated but does not donate it: each leaf's output could reuse its buffer")),
        Expect(K.UNDONATED_ARGUMENT, None, "optax", says="donat", why=(
            "the step returns this state updated but does not donate it: each leaf's output could reuse its buffer")),
    ),
    not_flagged=(
        NotFlagged("the loop carry copy keeps layout {1,0}: not a layout change",
                   shape=_X, says="layout change"),
        NotFlagged("no transpose and no layout change anywhere", kind=K.LAYOUT_CONFLICT),
        NotFlagged("the zero stacks are dynamic-update-slice destinations written "
                   "in place, not expanded broadcasts", kind=K.EXPANDED_BROADCAST),
    ),
)

# ------------------------------------------------------- ground truth, H200 --
# Read off XLA:GPU's optimized HLO for an H200 (h200/scan_remat.hlo.gz, jax
# 0.12). Forward loop (trip 4): the layer's weight is dynamic-sliced by an
# async fusion for a split-K gemm whose sum fuses bias, tanh and the
# residual; the carry needs no copy. Backward loop (trip 4): weight, saved
# input and bias sliced out of their stacks, the forward gemm recomputed
# (remat), dX and dW gemms, dW's split-K sum stored straight into the
# gradient stack. The head, a Dense(1), runs as multiply + reduce.
TRUTH_H200 = ModelTruth(
    expect=(
        Expect(K.STANDALONE_COPY, _X, "stack", says="loop-init copy", why=(
            "entry copy(x) into the forward loop's initial state (x is not donated)")),
        Expect(K.UNFUSED_PROLOGUE, f"f32[1,{DIM},{DIM}]", "stack", says="dynamic-slice",
               count=2, why=("the layer's weight dynamic-sliced into its own buffer each "
                             "trip for its gemms (forward; backward remat and dX)")),
        Expect(K.UNFUSED_PROLOGUE, f"f32[1,{BATCH},{DIM}]", "stack", says="dynamic-slice",
               why=("the saved layer input sliced out of the residual stack each "
                    "backward trip for the remat and dW gemms")),
        Expect((K.UNFUSED_PROLOGUE, K.MATERIALIZED_SLICE), f"f32[1,{DIM}]", "stack",
               says="dynamic-slice", why=(
                   "the layer's bias sliced out of its stack for the kernel that "
                   "finishes the remat gemm (its split-K sum adds the bias)")),
        Expect(K.SEPARATE_REDUCTION, _X, "layer_act", bytes=_PER_RUN // 2, why=(
            "tanh-backward dz re-read by the bias-gradient reduce each trip")),
        Expect(K.SEPARATE_REDUCTION, _X, "out", says="column_reduction", why=(
            "the head's weight-gradient terms (dpred * x) written only for their "
            "sum over the batch: the Dense(1) gradient XLA runs as multiply + "
            "reduce")),
        Expect(K.UNDONATED_ARGUMENT, None, "apply_updates", says="donat", count=2, why=(
            "params and the optimizer state are returned updated but not donated")),
        Expect(K.COSTLY_REMAT, "1 recomputed dots", "layer_dense", why=(
            "the backward loop recomputes the layer's forward gemm: a quarter of "
            "the step's dot flops (the Dense(1) head is no dot here)")),
    ),
    not_flagged=(
        NotFlagged("the loop carry keeps layout {1,0}: no layout change", shape=_X,
                   says="layout change"),
        NotFlagged("no transpose anywhere", kind=K.LAYOUT_CONFLICT),
        NotFlagged("the zero stacks are update destinations written in place",
                   kind=K.EXPANDED_BROADCAST),
    ),
)
