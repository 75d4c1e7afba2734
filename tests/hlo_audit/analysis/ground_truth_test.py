"""Ground truth of the audit on small JAX functions compiled on CPU.

Each function's optimized HLO was inspected once; the tests assert exactly
what XLA leaves materialized and what the audit must say about it, and that
our peak agrees with XLA's own (its allocations plus its temp buffer).
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import pytest

import hlo_audit
from hlo_audit import FindingKind, KernelKind, Lifetime, Verdict

S = jax.ShapeDtypeStruct
F32 = jnp.float32
M, K, N = 128, 256, 512


def gelu_epilogue(x, w, b):
  return jax.nn.gelu(x @ w + b, approximate=False)  # the line the finding cites


def transposed_output(x, w):
  return jnp.tanh(x @ w).T


def broadcast_into_dot(v, w):
  return jnp.broadcast_to(v, (256, 256)) @ w


def two_consumers(x, w, w2):
  h = x @ w
  return jnp.tanh(h) @ w2, jnp.sin(h)


def scan_with_carry(c, xs):
  def body(c, x):
    c = jnp.tanh(c @ x) + 1.0
    return c, c.sum()
  return jax.lax.scan(body, c, xs)


@functools.cache
def report(name: str) -> hlo_audit.AuditReport:
  cases = {
      "gelu": (gelu_epilogue, (S((M, K), F32), S((K, N), F32), S((N,), F32))),
      "transpose": (transposed_output, (S((M, K), F32), S((K, N), F32))),
      "broadcast": (broadcast_into_dot, (S((256,), F32), S((256, 512), F32))),
      "two_consumers": (two_consumers, (S((M, K), F32), S((K, N), F32), S((N, 64), F32))),
      "scan": (scan_with_carry, (S((64, 64), F32), S((10, 64, 64), F32))),
  }
  fn, args = cases[name]
  return hlo_audit.audit(fn, *args)


@pytest.mark.parametrize("name", ["gelu", "transpose", "broadcast", "two_consumers", "scan"])
def test_peak_agrees_with_xla_within_one_percent(name):
  r = report(name)
  assert r.xla_peak_bytes is not None
  assert abs(r.peak_agreement) <= 0.01, (r.peak_bytes, r.xla_peak_bytes)


def test_gelu_epilogue_is_one_unfused_epilogue_of_2MN4_bytes():
  r = report("gelu")
  epilogues = r.findings_of(FindingKind.UNFUSED_EPILOGUE)
  assert len(epilogues) == 1
  f = epilogues[0]
  assert f.bytes_saved == 2 * M * N * 4
  assert f.launches_removed == 1
  assert f.boundary_shape == f"f32[{M},{N}]"
  # GELU's own constant multiplies (x * 0.7071, 0.5 * ...) are not a scale.
  assert f.ops == ("bias", "activation:gelu")
  assert f.kernel == "pallas_kernels.matmul"
  assert f.verdict is Verdict.SAFE
  assert f.source is not None and f.source.file == __file__
  assert f.source.line == gelu_epilogue.__code__.co_firstlineno + 1
  # The matmul's f32 result is a transient read once; the output is external.
  boundary = r.buffer(f.boundary)
  assert boundary.lifetime is Lifetime.TRANSIENT and boundary.reuse_count == 1
  assert boundary.bytes == M * N * 4


@pytest.mark.parametrize("fn, ops", [
    # jax.nn.silu lowers to x * (1 / (1 + exp(-x))), without a logistic op.
    (lambda x, w, b: jax.nn.silu(x @ w * 0.5 + b),
     ("bias", "scale", "activation:silu")),
    (lambda x, w, b: jax.nn.sigmoid(x @ w + b), ("bias", "activation:sigmoid")),
    (lambda x, w, b: jax.nn.gelu(x @ w, approximate=True), ("activation:gelu_tanh",)),
    (lambda x, w, b: jnp.maximum(x @ w * b, 0.0), ("scale", "activation:relu")),
])
def test_epilogue_ops_name_what_the_matmul_kernel_takes(fn, ops):
  r = hlo_audit.audit(fn, S((M, K), F32), S((K, N), F32), S((N,), F32))
  (f,) = r.findings_of(FindingKind.UNFUSED_EPILOGUE)
  assert f.ops == ops


def test_transposed_output_is_a_transpose_epilogue():
  r = report("transpose")
  (f,) = r.findings_of(FindingKind.UNFUSED_EPILOGUE)
  assert f.ops == ("activation:tanh", "transpose")
  assert f.bytes_saved == 2 * M * N * 4
  assert f.kernel == "pallas_kernels.matmul"
  out = [b for b in r.buffers if b.lifetime is Lifetime.EXTERNAL_OUTPUT]
  assert [b.shape for b in out] == [f"f32[{N},{M}]"]


def test_broadcast_feeding_a_dot_is_an_expanded_broadcast():
  r = report("broadcast")
  (f,) = r.findings_of(FindingKind.EXPANDED_BROADCAST)
  assert f.boundary_shape == "f32[256,256]"
  # 256 KiB written and read, minus the 1 KiB compact vector, twice.
  assert f.bytes_saved == 2 * (256 * 256 * 4 - 256 * 4)
  assert r.buffer(f.boundary).lifetime is Lifetime.EXPANDED_BROADCAST
  assert not r.findings_of(FindingKind.UNFUSED_PROLOGUE)


def test_matmul_read_by_two_elementwise_kernels_is_one_two_output_epilogue():
  # h = x @ w is read by tanh (feeding the next dot) and by sin: both are
  # elementwise, so one epilogue could write tanh(h) and sin(h) from the
  # accumulator without recomputing anything; h itself need not be stored.
  r = report("two_consumers")
  assert not r.findings_of(FindingKind.KEEP_REUSE)
  (epi,) = [f for f in r.findings_of(FindingKind.UNFUSED_EPILOGUE)
            if f.boundary_shape == f"f32[{M},{N}]"]
  assert epi.ops[0] == "outputs:2" and "activation:tanh" in epi.ops
  assert len(epi.consumers) == 2 and epi.launches_removed == 2
  # One write and two reads of f32[128,512] go.
  assert epi.bytes_saved == 3 * M * N * 4
  assert epi.kernel is None  # pallas_kernels.matmul writes one output
  # What a kernel library is asked for: a dot writing two outputs.
  assert (epi.need.kind, epi.need.anchor, epi.need.outputs) == (
      FindingKind.UNFUSED_EPILOGUE, "dot", 2)
  assert epi.need.ops == epi.ops
  assert r.buffer(epi.boundary).reuse_count == 2


def test_scan_carried_copy_and_loop_trip_count():
  r = report("scan")
  # XLA copies the (not donated) argument `c` into the loop state the body
  # overwrites: a loop-init copy, not a layout change.
  loop_copies = [f for f in r.findings_of(FindingKind.STANDALONE_COPY)
                 if f.ops == ("loop-init copy (argument)",)]
  assert loop_copies, [f.evidence for f in r.findings]
  assert loop_copies[0].boundary_shape == "f32[64,64]"
  assert "c.1" in loop_copies[0].evidence and "donate" in loop_copies[0].evidence
  assert not r.findings_of(FindingKind.LAYOUT_CONFLICT)
  # The body's matmul epilogue runs 10 times per call: savings scale with it.
  (epi,) = r.findings_of(FindingKind.UNFUSED_EPILOGUE)
  assert epi.trip_count == 10
  assert epi.bytes_saved == 10 * 2 * 64 * 64 * 4
  assert "activation:tanh" in epi.ops
  body_kernels = [k for k in r.kernels if k.trip_count == 10]
  assert any(k.kind is KernelKind.CPU_LIBRARY_FUSION for k in body_kernels)
  # Loop state is carried, not transient.
  assert any(b.lifetime is Lifetime.INPUT and b.producer_opcode == "while"
             or any("while" in a for a in b.aliases) for b in r.buffers)


_SHARDED = textwrap.dedent("""
    import os, json
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
    import jax, jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec as P
    import hlo_audit
    mesh = jax.make_mesh((4,), ("d",))
    def f(x, w):
        return jnp.tanh(x @ w).sum(axis=0)
    jf = jax.jit(f, in_shardings=(NamedSharding(mesh, P(None, "d")),
                                  NamedSharding(mesh, P("d", None))),
                 out_shardings=NamedSharding(mesh, P()))
    r = hlo_audit.audit(jf, jax.ShapeDtypeStruct((256, 128), jnp.float32),
                        jax.ShapeDtypeStruct((128, 64), jnp.float32))
    print(json.dumps({
        "collectives": [k.opcode for k in r.kernels if k.kind.value == "collective"],
        "comm": [b.lifetime.value for b in r.buffers if b.producer_opcode == "all-reduce"],
        "peak": r.peak_bytes, "xla": r.xla_peak_bytes}))
""")


def test_sharded_function_on_four_cpu_devices_has_collectives():
  # Device count is fixed when JAX starts: run in a fresh process.
  env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=4"}
  out = subprocess.run([sys.executable, "-c", _SHARDED], capture_output=True,
                       text=True, env=env, timeout=300)
  assert out.returncode == 0, out.stderr[-2000:]
  result = json.loads(out.stdout.strip().splitlines()[-1])
  assert result["collectives"] == ["all-reduce"]
  assert result["comm"] == ["communication staging"]
  assert abs(result["peak"] - result["xla"]) <= 0.01 * result["xla"]


@functools.cache
def example_report(backward: bool) -> hlo_audit.AuditReport:
  from hlo_audit._src.examples.transformer import example
  fn, args = example(backward=backward)
  return hlo_audit.audit(fn, *args)


@pytest.mark.parametrize("backward", [False, True])
def test_built_in_example_peak_agrees_with_xla(backward):
  r = example_report(backward)
  assert abs(r.peak_agreement) <= 0.01, (r.peak_bytes, r.xla_peak_bytes)


def test_built_in_example_findings_carry_source_lines():
  r = example_report(True)
  assert r.findings
  for f in r.findings:
    assert f.source is not None, f
    assert f.source.file.endswith("transformer.py"), f.source
  kinds = {f.kind for f in r.findings}
  assert {FindingKind.UNFUSED_EPILOGUE, FindingKind.SEPARATE_REDUCTION,
          FindingKind.LAYOUT_CONFLICT} <= kinds
  # Backward pass: forward activations kept for it are classed as such.
  assert any(b.lifetime is Lifetime.SAVED_FOR_BACKWARD for b in r.buffers)
  # The layer norm's statistics re-read its input: a norm kernel closes it.
  assert any(f.kernel == "pallas_kernels.layer_norm"
             for f in r.findings_of(FindingKind.SEPARATE_REDUCTION))
  assert any(f.kernel == "pallas_kernels.softmax"
             for f in r.findings_of(FindingKind.SEPARATE_REDUCTION))
