"""pallas_kernels ops as `hlo-audit sweep` targets: the audit of an op's XLA
implementation at each grid point, its cost model, and optionally its
validation and timing (`hlo_audit.plugins.KernelSweep`)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from typing import Any

from hlo_audit import plugins

from pallas_kernels._src.spec import OpSpec


def build_case(spec: OpSpec, params: Mapping[str, Any], seed: int):
  """The op's case (random normal arrays, keyword options) at one point."""
  from pallas_kernels._src.cases import make_case

  p = dict(params)
  grad = bool(p.pop("grad", False))
  return make_case(spec.name, seed=seed, tags=("sweep",), grad=grad, **p)


def kernel_case(spec: OpSpec, params: Mapping[str, Any], seed: int, concrete: bool):
  """A point's case and the op's cost model for it: (case, bytes the op must
  move, flops). Unless `concrete`, the case holds `jax.ShapeDtypeStruct`s
  for its arrays and no array is made."""
  import jax

  if concrete:
    case = build_case(spec, params, seed)
    return case, int(spec.bytes_moved(case)), int(spec.flops(case))
  shell = {}

  def arrays():
    case = build_case(spec, params, seed)
    # The cost models may compute with array options: run them on the tracers.
    shell.update(case=case, cost=(int(spec.bytes_moved(case)), int(spec.flops(case))))
    return case.args, {k: v for k, v in case.kwargs.items() if isinstance(v, jax.Array)}

  args, array_kwargs = jax.eval_shape(arrays)
  case = shell["case"]  # Only its Python fields are read: its arrays were tracers.
  kwargs = {k: v for k, v in case.kwargs.items() if k not in array_kwargs}
  case = dataclasses.replace(case, args=tuple(args), kwargs={**kwargs, **array_kwargs})
  return (case, *shell["cost"])


class OpSweep:
  """One op as a sweep target."""

  def __init__(self, spec: OpSpec):
    self.spec = spec
    self.params = tuple(plugins.SweepParam(p.name, p.kind, p.default, p.optional)
                        for p in spec.sweep_params)

  def run(self, params, measure, audit):
    import jax

    from pallas_kernels._src.bench import bench
    from pallas_kernels._src.validate import validate

    spec = self.spec
    # An audit alone needs shapes only: no random inputs are made for it.
    case, nbytes, flops = kernel_case(spec, params, measure.seed,
                                      concrete=measure.validate or measure.time)
    # One case, whatever tag `validate` and `bench` ask for.
    single = dataclasses.replace(spec, cases=lambda tag, seed: iter((case,)))
    # Array options (quantization scales) are inputs of the audited program,
    # as in a real one, not constants folded into it.
    array_keys = [k for k, v in case.kwargs.items() if hasattr(v, "shape")]
    static = {k: v for k, v in case.kwargs.items() if k not in array_keys}
    n = len(case.args)

    def xla(*inputs):
      return spec.fn(*inputs[:n], implementation="xla", **static,
                     **dict(zip(array_keys, inputs[n:])))

    abstract = [jax.ShapeDtypeStruct(a.shape, a.dtype)
                for a in (*case.args, *(case.kwargs[k] for k in array_keys))]
    out = audit(jax.jit(xla), abstract)
    out["kernel"] = {"case": case.name, "bytes_moved": nbytes, "flops": flops}
    if measure.validate:
      t0 = time.perf_counter()
      v = validate(single, tags=("sweep",), seed=measure.seed,
                   check_grads=bool(params["grad"]))
      row = v.rows[0]
      out["validation"] = {
          "passed": row.passed, "kernel_err": row.kernel_err, "xla_err": row.xla_err,
          "bound": row.bound, "grad_err": row.grad_err, "grad_bound": row.grad_bound,
          "written": row.written, "nonfinite_ok": row.nonfinite_ok,
          "repeat_exact": row.repeat_exact, "fallback": row.fallback,
          "interpret": v.interpret}
      out["seconds"]["validate"] = time.perf_counter() - t0
    if measure.time:
      t0 = time.perf_counter()
      b = bench(single, tags=("sweep",), repeats=measure.repeats,
                warmup=measure.warmup, seed=measure.seed)
      row = b.rows[0]
      out["timing"] = {
          "kernel_ms": row.kernel_ms, "xla_ms": row.xla_ms, "speedup": row.speedup,
          "kernel_gbps": row.kernel_gbps, "xla_gbps": row.xla_gbps,
          "kernel_tflops": row.kernel_tflops, "fallback": row.fallback,
          "interpret": b.interpret, "device": b.device,
          "timings_meaningful": b.timings_meaningful}
      out["seconds"]["time"] = time.perf_counter() - t0
    return out
