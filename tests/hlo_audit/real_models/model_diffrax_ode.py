"""diffrax neural ODE trained with optax, as diffrax's "Neural ODE" example
writes it: an equinox MLP vector field, `diffrax.diffeqsolve` with Tsit5, a
PID step-size controller and `SaveAt(ts=...)`, vmapped over initial
conditions, mean-squared error to the trajectories,
`eqx.filter_value_and_grad` (diffrax's default adjoint: backpropagation
through the solver's checkpointed while loop), an optax update, under
`eqx.filter_jit`."""

from __future__ import annotations

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import optax

BATCH, TIMES, DATA, WIDTH, DEPTH = 16, 8, 2, 32, 2


class Func(eqx.Module):
  mlp: eqx.nn.MLP

  def __init__(self, key):
    self.mlp = eqx.nn.MLP(DATA, DATA, WIDTH, DEPTH, activation=jax.nn.softplus, key=key)

  def __call__(self, t, y, args):
    return self.mlp(y)  # <field>


class NeuralODE(eqx.Module):
  func: Func

  def __init__(self, key):
    self.func = Func(key)

  def __call__(self, ts, y0):
    solution = diffrax.diffeqsolve(  # <solve>
        diffrax.ODETerm(self.func), diffrax.Tsit5(), t0=ts[0], t1=ts[-1],
        dt0=ts[1] - ts[0], y0=y0,
        stepsize_controller=diffrax.PIDController(rtol=1e-3, atol=1e-6),
        saveat=diffrax.SaveAt(ts=ts))
    return solution.ys


@eqx.filter_value_and_grad
def grad_loss(model, ti, yi):
  y_pred = jax.vmap(model, in_axes=(None, 0))(ti, yi[:, 0])  # <vmap>
  return jnp.mean((yi - y_pred) ** 2)  # <mse>


optim = optax.adabelief(3e-3)


@eqx.filter_jit
def make_step(ti, yi, model, opt_state):
  loss, grads = grad_loss(model, ti, yi)  # <grad>
  updates, opt_state = optim.update(grads, opt_state)  # <optax>
  model = eqx.apply_updates(model, updates)  # <apply>
  return loss, model, opt_state


def build():
  # eqx.filter_jit itself: the audit lowers it (its `.lowered` is jax's stage).
  model = NeuralODE(jax.random.key(0))
  opt_state = optim.init(eqx.filter(model, eqx.is_inexact_array))
  ts = jnp.linspace(0.0, 10.0, TIMES)
  ys = jnp.zeros((BATCH, TIMES, DATA), jnp.float32)
  return make_step, (ts, ys, model, opt_state)


def step():
  """The step as compiled for an H200 on a machine without a GPU
  (`h200_support`). Equinox raises diffrax's runtime errors (ts not
  increasing, the solve failing) through host callbacks, which a
  compile-only GPU topology cannot lower; while this step is traced its
  checks fill NaNs instead (as `EQX_ON_ERROR=nan` does), and the rest of
  the program is unchanged. Trace it in a process that has not traced the
  step before (jax caches the traced checks)."""
  from equinox import _errors
  fn, args = build()

  def make_step_without_host_callbacks(*a):
    saved, _errors.EQX_ON_ERROR = _errors.EQX_ON_ERROR, "nan"
    try:
      return fn(*a)
    finally:
      _errors.EQX_ON_ERROR = saved

  return make_step_without_host_callbacks, args


# ------------------------------------------------------------ ground truth --
# Read off the optimized CPU HLO (jax 0.10.2 and 0.11.2 give the same
# kernels; 0.12 carries fewer checkpoint stacks, counts below). Forward: the
# vmapped solve is a while loop over steps (diffrax's checkpointed loop:
# 90 checkpoints per trajectory, equinox's default for max_steps=4096, in
# stacks [16,90] and [16,90,2] written in place by dynamic-update-slice),
# each step a loop over Tsit5's 7 stages (the MLP: a dot per layer as an
# XNNPACK (ynn) fusion, each read back by a loop fusion adding the bias and
# applying softplus) and a loop saving the outputs at `ts`. Between the
# passes the checkpoints are sorted: each stack is gathered into [90,16]
# order, copied by a loop fusion whose transpose only relabels the layout
# ({0,1}: the same bytes), then transposed back to {1,0} by a copy for the
# backward loop's carry. The backward loop re-runs each step's stages (the
# same dots and softplus) and backpropagates through them in another loop:
# dy @ W3^T and dh @ W2^T read once by softplus' derivative; weight
# gradients are per-trajectory outer products accumulated in the carry,
# summed over the batch after the loop, then adabelief. Zero broadcasts
# initialise several carries each, copied into each further carry's buffer.
# Equinox's error checks are host callbacks.
from hlo_audit import FindingKind as K  # noqa: E402
from tests.hlo_audit.real_models.truth import (Expect, ModelTruth, NotFlagged,  # noqa: E402
                                               per_version)

_H = f"f32[{BATCH},{WIDTH}]"
_STACK_F, _STACK_S = f"f32[{BATCH},90]", f"s32[{BATCH},90]"
_STACK_Y = f"f32[{BATCH},90,{DATA}]"
_F32_STACKS = per_version(4, 4, 2)
_S32_STACKS = per_version(6, 6, 2)

TRUTH = ModelTruth(
    expect=(
        Expect(K.STANDALONE_COPY, _STACK_Y, "solve", says="same-layout copy", count=2, why=(
            "bitcast_transpose_fusion.*: each gathered [90,16,2] checkpoint stack "
            "(state-sized) written again by a loop fusion whose transpose to layout {2,0,1} "
            "moves no element (a bitcast would do)")),
        Expect(K.STANDALONE_COPY, _STACK_F, "solve", says="same-layout copy",
               count=_F32_STACKS, why=(
                   "the same identity copy of each gathered f32 checkpoint stack")),
        Expect(K.STANDALONE_COPY, _STACK_S, "solve", says="same-layout copy",
               count=_S32_STACKS, why=(
                   "the same identity copy of each gathered s32 checkpoint stack")),
        Expect(K.STANDALONE_COPY, _STACK_Y, None, says="layout change {", count=2, why=(
            "wrapped_copy.*: each [16,90,2] stack transposed from {2,0,1} to the "
            "backward loop's {2,1,0} (the gather could write that layout)")),
        Expect(K.STANDALONE_COPY, _STACK_F, None, says="layout change {",
               count=_F32_STACKS, why="the same transposing copy of each f32 stack"),
        Expect(K.STANDALONE_COPY, _STACK_S, None, says="layout change {",
               count=_S32_STACKS, why="the same transposing copy of each s32 stack"),
        Expect(K.STANDALONE_COPY, _STACK_Y, None, says="loop-init copy", why=(
            "a zero broadcast initialises two [16,90,2] checkpoint stacks of the "
            "forward loop: copied into the second's buffer")),
        Expect(K.STANDALONE_COPY, _STACK_F, None, says="loop-init copy",
               count=per_version(3, 3, 1), why=(
                   "a zero broadcast copied into each further f32 checkpoint stack "
                   "of the forward loop's initial state")),
        Expect(K.STANDALONE_COPY, _STACK_S, None, says="loop-init copy",
               count=per_version(5, 5, 1), why=(
                   "a zero broadcast copied into each further s32 checkpoint stack "
                   "of the forward loop's initial state")),
        Expect(K.STANDALONE_COPY, _H, None, says="loop-init copy", count=2, why=(
            "zeros copied into a second [16,32] gradient accumulator of the "
            "backward loop and of its stage loop")),
        Expect(K.UNFUSED_EPILOGUE, _H, "field", says="bias", count=4, why=(
            "the vector field's first two Linear layers, in the forward stage loop "
            "and in the backward pass's re-run of it: each dot's result read once "
            "by a loop fusion adding the bias and applying softplus")),
        Expect(K.UNFUSED_EPILOGUE, _H, "field", says="elementwise", count=2, why=(
            "the backward stage loop: dy @ W3^T and dh @ W2^T each read once by "
            "the kernel multiplying by softplus' derivative")),
        Expect(K.UNDONATED_ARGUMENT, None, "apply", says="donat", why=(
            "the model and the optimizer state are returned updated but not donated")),
    ),
    not_flagged=(
        NotFlagged("the activation is softplus (max(x, 0) + log1p(exp(-|x|)), "
                   "as the metadata's vmap(jit(softplus)) says), not relu: a relu "
                   "epilogue computes something else", says="relu"),
        NotFlagged("no norm, softmax or attention here", says="norm"),
    ),
)

# ------------------------------------------------------- ground truth, H200 --
# Read off XLA:GPU's optimized HLO for an H200 (h200/diffrax_ode.hlo.gz, jax
# 0.12, compiled from `step()`: equinox's checks as NaN selects, not host
# callbacks). The same loops, fused further: the checkpoint gathers write
# the backward loop's layout directly (one kernel each, or one gather plus
# transpose), zero-initialised carries are written by multi-output
# broadcast fusions (the copies fused in), so no stack is copied. In the
# stage loops the first Linear's dot (K=2) is a loop fusion whose result a
# loop fusion reads to add the bias and apply softplus; the second's is a
# Triton gemm adding its bias inside, read by a loop fusion applying
# softplus. The backward stage loop's dy @ W3^T and dh @ W2^T are each read
# once by a kernel multiplying by softplus' derivative and accumulating the
# bias gradient (two outputs).
TRUTH_H200 = ModelTruth(
    expect=(
        Expect(K.STANDALONE_COPY, _H, None, says="loop-init copy", why=(
            "copy.93: zeros copied into a second [16,32] gradient accumulator of "
            "the backward stage loop")),
        Expect(K.UNFUSED_EPILOGUE, _H, "field", says="bias", count=2, why=(
            "wrapped_dot, wrapped_dot.1: the first Linear's dot (forward stage loop "
            "and its re-run in the backward pass), read once by the kernel adding "
            "the bias and applying softplus")),
        Expect(K.UNFUSED_EPILOGUE, _H, "field", count=2, why=(
            "gemm_fusion_dot.40, .49: the second Linear's Triton gemm (bias added "
            "inside), read once by a loop fusion applying softplus")),
        Expect(K.UNFUSED_EPILOGUE, _H, "field", says="outputs:2", count=2, why=(
            "gemm_fusion_dot_general.8, wrapped_dot.2: dh @ W2^T and dy @ W3^T, "
            "each read once by a kernel writing the gradient through softplus and "
            "the bias gradient's running sum")),
        Expect(K.UNDONATED_ARGUMENT, None, "apply", says="donat", why=(
            "the model and the optimizer state are returned updated but not donated")),
    ),
    not_flagged=(
        NotFlagged("the activation is softplus (max(x, 0) + log1p(exp(-|x|))), not "
                   "relu: a relu epilogue computes something else", says="relu"),
        NotFlagged("no norm, softmax or attention here", says="norm"),
    ),
)
