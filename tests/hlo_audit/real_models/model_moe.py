"""flax.linen mixture-of-experts layer with top-2 routing (softmax router,
`jax.lax.top_k`, one-hot dispatch, experts as batched einsums) and a
Switch-style load-balancing loss, trained with optax adamw."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

TOKENS, DIM, EXPERTS, TOP_K, HIDDEN = 256, 64, 8, 2, 128


class MoE(nn.Module):
  @nn.compact
  def __call__(self, x):
    logits = nn.Dense(EXPERTS, use_bias=False, name="router")(x)  # <router>
    probs = jax.nn.softmax(logits, axis=-1)  # <probs>
    weights, idx = jax.lax.top_k(probs, TOP_K)  # <topk>
    dispatch = jax.nn.one_hot(idx, EXPERTS)  # <dispatch>
    combine = jnp.einsum("tk,tke->te", weights, dispatch)  # <combine>
    w_in = self.param("w_in", nn.initializers.lecun_normal(), (EXPERTS, DIM, HIDDEN))
    w_out = self.param("w_out", nn.initializers.lecun_normal(), (EXPERTS, HIDDEN, DIM))
    h = jax.nn.gelu(jnp.einsum("td,edh->teh", x, w_in))  # <expert_in>
    y = jnp.einsum("teh,ehd->ted", h, w_out)  # <expert_out>
    out = jnp.einsum("ted,te->td", y, combine)  # <mix>
    # Switch Transformer's auxiliary loss: tokens routed to each expert
    # times the router's mean probability for it.
    routed = dispatch.sum(axis=1).mean(axis=0)  # <routed>
    aux = EXPERTS * jnp.sum(routed * probs.mean(axis=0))  # <aux>
    return out, aux


class Model(nn.Module):
  @nn.compact
  def __call__(self, x):
    h, aux = MoE()(nn.Dense(DIM)(x))  # <moe>
    return nn.Dense(1)(x + h), aux  # <out>


model = Model()
tx = optax.adamw(1e-3)


def train_step(params, opt_state, x, y):
  def loss_fn(params):
    pred, aux = model.apply({"params": params}, x)  # <apply>
    return jnp.mean((pred - y) ** 2) + 0.01 * aux  # <loss>
  loss, grads = jax.value_and_grad(loss_fn)(params)  # <grad>
  updates, opt_state = tx.update(grads, opt_state, params)  # <optax>
  return optax.apply_updates(params, updates), opt_state, loss


def build():
  x = jnp.zeros((TOKENS, DIM), jnp.float32)
  params = model.init(jax.random.key(0), x)["params"]
  return jax.jit(train_step), (params, tx.init(params), x, jnp.zeros((TOKENS, 1)))


# ------------------------------------------------------------ ground truth --
# Read off the optimized CPU HLO (jax 0.10.2, 0.11.2, 0.12: the same kernels).
# The router's softmax reads the router dot's logits (max, then the sum of
# exp); top_k's one-hot dispatch f32[256,2,8] is summed over tokens and the
# top-k axis in the forward pass (routing counts for the auxiliary loss);
# experts are batched dots whose results are read back by gelu, transposes
# and the combine; weight gradients are read by adamw's two moments.
from hlo_audit import FindingKind as K  # noqa: E402
from tests.hlo_audit.real_models.truth import Expect, ModelTruth, NotFlagged  # noqa: E402

TRUTH = ModelTruth(
    expect=(
        Expect(K.STANDALONE_COPY, "f32[512,1,1]", "combine", why=(
            "same-layout copy: a copy kernel of its own")),
        Expect(K.LAYOUT_CONFLICT, "f32[256,8,64]", "expert_out", why=(
            "transpose: a transpose XLA materialized for the dot (or, keep: for the convolution library) that reads it")),
        Expect(K.LAYOUT_CONFLICT, "f32[1024,64]", "expert_in", why=(
            "transpose: a transpose XLA materialized for the dot (or, keep: for the convolution library) that reads it")),
        Expect(K.LAYOUT_CONFLICT, "f32[64,1024]", "expert_in", why=(
            "transpose: a transpose XLA materialized for the dot (or, keep: for the convolution library) that reads it")),
        Expect(K.UNFUSED_EPILOGUE, "f32[8,256,128]", "expert_out", why=(
            "outputs:2: the anchor's result written to memory and read back by elementwise work")),
        Expect(K.UNFUSED_EPILOGUE, "f32[256,1024]", "expert_in", why=(
            "outputs:3: the anchor's result written to memory and read back by elementwise work")),
        Expect(K.UNFUSED_EPILOGUE, "f32[8,64,256]", "expert_out", why=(
            "transpose: the anchor's result written to memory and read back by elementwise work")),
        Expect(K.UNFUSED_EPILOGUE, "f32[8,128,64]", "expert_out", why=(
            "outputs:2: the anchor's result written to memory and read back by elementwise work")),
        Expect(K.UNFUSED_EPILOGUE, "f32[1024,64]", "expert_in", why=(
            "outputs:2: the anchor's result written to memory and read back by elementwise work")),
        Expect(K.UNFUSED_EPILOGUE, "f32[256,64]", "mix", why=(
            "residual: the anchor's result written to memory and read back by elementwise work")),
        Expect(K.UNFUSED_EPILOGUE, "f32[256,64]", "router", why=(
            "residual: the anchor's result written to memory and read back by elementwise work")),
        Expect(K.UNFUSED_EPILOGUE, "f32[256,64]", "expert_in", why=(
            "residual: the anchor's result written to memory and read back by elementwise work")),
        Expect(K.UNFUSED_EPILOGUE, "f32[256,64]", "moe", why=(
            "bias: the anchor's result written to memory and read back by elementwise work")),
        Expect(K.UNFUSED_EPILOGUE, "f32[256,1,2]", "combine", why=(
            "dot.15, the top-k weights' gradient (the combine einsum's backward), "
            "read only by bitcast_copy_fusion, which copies it into the scatter-"
            "add's updates and reads nothing else: the dot could store it there")),
        Expect(K.UNFUSED_EPILOGUE, "f32[64,64]", "moe", why=(
            "outputs:2: the anchor's result written to memory and read back by elementwise work")),
        Expect(K.UNFUSED_EPILOGUE, "f32[64,8]", "router", why=(
            "outputs:2: the anchor's result written to memory and read back by elementwise work")),
        Expect(K.UNFUSED_PROLOGUE, "f32[8,64,256]", None, why=(
            "affine: elementwise work written to memory only for the matmuls that read it")),
        Expect(K.UNFUSED_PROLOGUE, "f32[256,64]", "out", why=(
            "affine: elementwise work written to memory only for the matmuls that read it")),
        Expect(K.UNFUSED_PROLOGUE, "f32[256,8]", "probs", why=(
            "affine: elementwise work written to memory only for the matmuls that read it")),
        Expect(K.SEPARATE_REDUCTION, "f32[256,64]", "router", says="column_reduction", why=(
            "column_reduction: a buffer written by one kernel and re-read by a separate reduction")),
        Expect(K.SEPARATE_REDUCTION, "f32[256,2,8]", "dispatch", says="column_reduction", why=(
            "column_reduction: a buffer written by one kernel and re-read by a separate reduction")),
        Expect(K.SEPARATE_REDUCTION, "f32[256,8]", "probs", why=(
            "reduce: a buffer written by one kernel and re-read by a separate reduction")),
        Expect(K.SEPARATE_REDUCTION, "f32[256,8]", "probs", says="column_reduction", why=(
            "column_reduction: a buffer written by one kernel and re-read by a separate reduction")),
        Expect(K.SEPARATE_REDUCTION, "f32[256,8]", "aux", why=(
            "reduce: a buffer written by one kernel and re-read by a separate reduction")),
        Expect(K.SEPARATE_REDUCTION, "f32[256,8]", "router", says="softmax", why=(
            "softmax: a buffer written by one kernel and re-read by a separate reduction")),
        Expect(K.UNDONATED_ARGUMENT, None, None, says="donat", why=(
            "params['Dense_0']['bias']: state the step returns updated but does not donate: XLA cannot reuse its buffers")),
        Expect(K.UNDONATED_ARGUMENT, None, "optax", says="donat", why=(
            "opt_state[0].count: state the step returns updated but does not donate: XLA cannot reuse its buffers")),
    ),
    not_flagged=(
        NotFlagged("the one-hot dispatch's sum is forward routing work, not a bias "
                   "or gamma gradient", kind=K.SEPARATE_REDUCTION, shape="f32[256,2,8]",
                   evidence="gradient"),
        NotFlagged("no norm in this model", says="norm"),
    ),
)

# ------------------------------------------------------- ground truth, H200 --
# Read off XLA:GPU's optimized HLO for an H200 (h200/moe.hlo.gz, jax 0.12).
# The router's softmax is XLA's one-kernel Triton softmax; top_k is a sort
# writing sorted values and indices; each reader rebuilds the one-hot
# dispatch from the indices. Experts are gemms in expert-major layouts
# ([8,64,256]: experts, features, tokens); the combine ("ted,te->td") and the
# last Dense(1) run as multiply + reduce, not as dots.
TRUTH_H200 = ModelTruth(
    expect=(
        Expect(K.UNFUSED_EPILOGUE, f"f32[{EXPERTS},{TOKENS},{HIDDEN}]", "expert_out", why=(
            "dy @ w_out^T per expert read once by the gelu backward")),
        Expect(K.UNFUSED_EPILOGUE, f"f32[{TOKENS},{EXPERTS * HIDDEN}]", "expert_in",
               says="gelu", why=("x @ w_in read back by gelu, and by the gelu "
                                 "backward")),
        Expect(K.UNFUSED_EPILOGUE, f"f32[{DIM},{EXPERTS}]", "router", says="outputs:3",
               why="the router's weight gradient read once by its adamw fusion"),
        Expect(K.SEPARATE_REDUCTION, f"f32[{EXPERTS},{DIM},{TOKENS}]", "expert_out",
               says="contraction", why=(
                   "the experts' outputs re-read by the combine, which multiplies "
                   "them by the routing weights and sums over the experts")),
        Expect(K.SEPARATE_REDUCTION, f"f32[{EXPERTS},{TOKENS}]", "combine",
               says="contraction", why="the routing weights re-read by the same combine"),
        Expect(K.SEPARATE_REDUCTION, f"f32[{DIM},{TOKENS}]", "mix", says="contraction", why=(
            "the layer's output re-read by the head, a Dense(1) XLA runs as "
            "multiply + reduce")),
        Expect(K.SEPARATE_REDUCTION, f"f32[{DIM},{TOKENS}]", "out", says="contraction", why=(
            "the head's input gradient written only for the kernel summing it "
            "against the experts' outputs (dcombine), over the features")),
        Expect(K.SEPARATE_REDUCTION, f"f32[{TOKENS},{DIM}]", "out", says="column_reduction",
               why=("the head's weight-gradient terms written only for their sum "
                    "over the tokens")),
        Expect(K.SEPARATE_REDUCTION, f"f32[{TOKENS},{DIM}]", "router",
               says="column_reduction", why=(
                   "the gradient into the first Dense's output re-read by its "
                   "bias-gradient reduce")),
        Expect(K.SEPARATE_REDUCTION, f"f32[{TOKENS},{EXPERTS}]", "probs",
               says="column_reduction", why=(
                   "the router's probabilities re-read by their mean over tokens "
                   "(the auxiliary loss)")),
        Expect(K.SEPARATE_REDUCTION, f"f32[{TOKENS},{EXPERTS}]", "topk", says="reduce", why=(
            "the sorted top-k values re-read by the combine's sum over the top-k "
            "axis")),
        Expect(K.SEPARATE_REDUCTION, f"s32[{TOKENS},{EXPERTS}]", "topk", says="reduce", why=(
            "the sorted indices re-read by the combine and by the routing counts' "
            "sum, each rebuilding the one-hot dispatch")),
        Expect(K.UNDONATED_ARGUMENT, None, None, says="donat", count=2, why=(
            "params and the optimizer state are returned updated but not donated")),
    ),
    not_flagged=(
        NotFlagged("the combine's sum over the experts is no sum over the batch",
                   evidence="sum or mean over the batch", shape=f"f32[{EXPERTS},{DIM},{TOKENS}]"),
        NotFlagged("axis 0 of the expert-major buffers is the experts, not the batch",
                   evidence="batch axis", shape=f"f32[{EXPERTS},{DIM},{TOKENS}]"),
        NotFlagged("the aux-loss gradient broadcast is the scatter's destination, "
                   "updated in place, not re-read by a reduction",
                   kind=K.SEPARATE_REDUCTION, boundary="loop_broadcast_fusion"),
        NotFlagged("XLA's Triton softmax is one kernel", says="pallas_kernels.softmax"),
        NotFlagged("no norm in this model", says="norm"),
    ),
)
