"""Sharded programs: per-device peaks, collectives and their findings.

The three functions compiled on 8 host devices (in a subprocess, since the
device count must be set before JAX starts) were inspected by hand:

- data parallel: weights replicated, x split over the batch; one all-reduce
  of the two weight gradients (2 x 2 MiB): a ring sends 2 * 4 MiB * 7/8.
- FSDP: weights split on their rows; the forward all-gathers w1 (256 KiB per
  device -> 2 MiB) and feeds it straight into the dot.
- tensor-parallel MLP: w1 split on columns, w2 on rows; one all-reduce of
  the f32[256,512] output (512 KiB).
The per-device peak must agree with XLA's footprint within 1%.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import textwrap

import pytest

import hlo_audit
from hlo_audit import Capture, FindingKind

_SCRIPT = textwrap.dedent("""
    import json, os
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
    import jax, jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec as P
    import hlo_audit

    mesh = jax.make_mesh((8,), ("d",))
    mesh2d = jax.make_mesh((4, 2), ("data", "model"))
    ns = lambda *spec: NamedSharding(mesh, P(*spec))
    S = jax.ShapeDtypeStruct

    def mlp_loss(w1, w2, x):
      return jnp.sum(jax.nn.gelu(x @ w1) @ w2)

    def mlp(w1, w2, x):
      return jax.nn.gelu(x @ w1) @ w2

    grads = jax.grad(mlp_loss, argnums=(0, 1))
    programs = {
        "dp": jax.jit(grads, in_shardings=(ns(), ns(), ns("d", None))),
        "fsdp": jax.jit(grads, in_shardings=(ns("d", None),) * 3,
                        out_shardings=(ns("d", None),) * 2),
        "tp": jax.jit(mlp, in_shardings=(ns(None, "d"), ns("d", None), ns())),
        # The same step on a 4 x 2 mesh, the weights still replicated.
        "dp_2d": jax.jit(grads, in_shardings=(
            NamedSharding(mesh2d, P()), NamedSharding(mesh2d, P()),
            NamedSharding(mesh2d, P("data", None)))),
        "shard_map": jax.jit(jax.shard_map(
            lambda w, x: jax.lax.psum(x @ w, "d"), mesh=mesh,
            in_specs=(P("d", None), P(None, "d")), out_specs=P())),
    }
    args = (S((512, 1024), jnp.float32), S((1024, 512), jnp.float32),
            S((256, 512), jnp.float32))
    out = {}
    for name, fn in programs.items():
      a = args if name != "shard_map" else (
          S((1024, 512), jnp.float32, sharding=ns("d", None)),
          S((256, 1024), jnp.float32, sharding=ns(None, "d")))
      r = hlo_audit.audit(fn, *a)
      out[name] = {
          "peak": r.peak_bytes, "xla": r.xla_peak_bytes,
          "collectives": [[c.opcode, c.group_size, c.bytes_sent, c.bytes_received,
                           c.operand_bytes, c.result_bytes] for c in r.collectives],
          # Replicated parameters by argument path (their boundary is the HLO
          # parameter).
          "findings": [[f.kind.slug, f.ops[0] if f.kind.slug == "replicated-buffer"
                        else f.boundary, f.peak_saved] for f in r.findings
                       if f.kind.slug in ("collective-matmul", "replicated-buffer",
                                          "reshard-around-collective",
                                          "exposed-collective")],
          "suggestions": {f.ops[0]: f.suggestion for f in r.findings
                          if f.kind.slug == "replicated-buffer"},
      }
    print(json.dumps(out))
""")


@functools.cache
def sharded() -> dict:
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8",
             JAX_PLATFORMS="cpu")
  env["PYTHONPATH"] = os.pathsep.join([os.getcwd(), env.get("PYTHONPATH", "")])
  out = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True,
                       text=True, env=env, timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("name", ["dp", "dp_2d", "fsdp", "tp", "shard_map"])
def test_per_device_peak_agrees_with_xla(name):
  r = sharded()[name]
  assert abs(r["peak"] - r["xla"]) <= 0.01 * r["xla"], r


MiB = 1 << 20


def test_data_parallel_all_reduce_and_replicated_weights():
  r = sharded()["dp"]
  assert r["collectives"] == [["all-reduce", 8, 2 * 4 * MiB * 7 // 8,
                               2 * 4 * MiB * 7 // 8, 4 * MiB, 4 * MiB]]
  replicated = {f[1]: f[2] for f in r["findings"] if f[0] == "replicated-buffer"}
  # 2 MiB each, 7/8 of it held on every device for nothing.
  assert replicated == {"w1": 2 * MiB * 7 // 8, "w2": 2 * MiB * 7 // 8}
  # Each split along its first axis that eight devices divide, over the
  # mesh axis as the user named it (the optimized HLO calls it 'axis_0').
  assert r["suggestions"] == {"w1": "NamedSharding(mesh, P('d', None)) for w1",
                              "w2": "NamedSharding(mesh, P('d', None)) for w2"}


def test_a_replicated_weight_on_a_two_axis_mesh_splits_over_both_axes():
  r = sharded()["dp_2d"]
  assert r["suggestions"] == {
      "w1": "NamedSharding(mesh, P(('data', 'model'), None)) for w1",
      "w2": "NamedSharding(mesh, P(('data', 'model'), None)) for w2"}


def test_fsdp_gather_feeding_a_dot_is_a_collective_matmul_candidate():
  r = sharded()["fsdp"]
  gathers = [c for c in r["collectives"] if c[0] == "all-gather"]
  assert gathers[0] == ["all-gather", 8, 2 * MiB * 7 // 8, 2 * MiB * 7 // 8,
                        256 * 1024, 2 * MiB]
  assert [f for f in r["findings"] if f[0] == "collective-matmul"]
  assert not [f for f in r["findings"] if f[0] == "replicated-buffer"]


def test_tensor_parallel_mlp_reduces_its_output_once():
  r = sharded()["tp"]
  assert r["collectives"] == [["all-reduce", 8, 2 * 512 * 1024 * 7 // 8,
                               2 * 512 * 1024 * 7 // 8, 512 * 1024, 512 * 1024]]


def test_shard_map_psum_is_a_collective():
  r = sharded()["shard_map"]
  assert [c[0] for c in r["collectives"]] == ["all-reduce"]


# An async all-gather as GPU dumps show it: the first pair has nothing between
# start and done; the second overlaps a fusion that does not need it.
_ASYNC = """
HloModule async_gathers, is_scheduled=true, num_partitions=4

%add_f {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

%neg_f {
  %p = f32[256,256]{1,0} parameter(0)
  ROOT %n = f32[256,256]{1,0} negate(%p)
}

ENTRY %main {
  %x = f32[64,256]{1,0} parameter(0)
  %y = f32[64,256]{1,0} parameter(1)
  %z = f32[256,256]{1,0} parameter(2)
  %ags = (f32[64,256]{1,0}, f32[256,256]{1,0}) all-gather-start(%x), channel_id=1, replica_groups=[1,4]<=[4], dimensions={0}, use_global_device_ids=true
  %agd = f32[256,256]{1,0} all-gather-done(%ags)
  %ags2 = (f32[64,256]{1,0}, f32[256,256]{1,0}) all-gather-start(%y), channel_id=2, replica_groups={{0,1,2,3}}, dimensions={0}, use_global_device_ids=true
  %neg = f32[256,256]{1,0} fusion(%z), kind=kLoop, calls=%neg_f
  %agd2 = f32[256,256]{1,0} all-gather-done(%ags2)
  %dot = f32[256,256]{1,0} dot(%agd, %agd2), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT %out = f32[256,256]{1,0} add(%dot, %neg)
}
"""


def test_async_collectives_exposed_and_overlapped():
  r = hlo_audit.audit_hlo(_ASYNC)
  first, second = r.collectives
  assert (first.name, first.done, first.group_size) == ("ags", "agd", 4)
  assert first.bytes_sent == 256 * 256 * 4 * 3 // 4 and first.is_async
  assert first.overlapped == () and second.overlapped == ("neg",)
  exposed = r.findings_of(FindingKind.EXPOSED_COLLECTIVE)
  assert [f.boundary for f in exposed] == ["ags"]
  matmul = r.findings_of(FindingKind.COLLECTIVE_MATMUL)
  assert {f.boundary for f in matmul} == {"agd", "agd2"}


# A partitioned step as newer XLA prints it optimized: the entry parameters
# have lost their shardings, which the HLO before optimization still holds.
_UNANNOTATED = """
HloModule dp_step, is_scheduled=true, num_partitions=4

%fused_gelu (p0: f32[64,1024]) -> f32[64,1024] {
  %p0 = f32[64,1024]{1,0} parameter(0)
  ROOT %t = f32[64,1024]{1,0} tanh(%p0)
}

ENTRY %main (w: f32[1024,1024], x: f32[64,1024]) -> f32[64,1024] {
  %w = f32[1024,1024]{1,0} parameter(0), metadata={op_name="params['w']"}
  %x = f32[64,1024]{1,0} parameter(1), metadata={op_name="x"}
  %d = f32[64,1024]{1,0} dot(%x, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT %g = f32[64,1024]{1,0} fusion(%d), kind=kLoop, calls=%fused_gelu
}
"""

_BEFORE_OPTIMIZATION = """
HloModule dp_step, num_partitions=4

ENTRY %main (w: f32[1024,1024], x: f32[256,1024]) -> f32[256,1024] {
  %w = f32[1024,1024]{1,0} parameter(0), sharding={replicated}
  %x = f32[256,1024]{1,0} parameter(1), sharding={devices=[4,1]<=[4]}
  %d = f32[256,1024]{1,0} dot(%x, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT %g = f32[256,1024]{1,0} tanh(%d), sharding={devices=[4,1]<=[4]}
}
"""


# The mesh as Shardy writes it into the module's frontend attributes, once
# plain and once inside a string (its quotes escaped).
_MESHES = ('HloModule dp_step, num_partitions=4, '
           'frontend_attributes={xla.sdy.meshes={mesh = #sdy.mesh<["batch"=4]>}}',
           'HloModule dp_step, num_partitions=4, '
           'frontend_attributes={xla.sdy.meshes="{mesh = #sdy.mesh<[\\"x\\"=2, \\"y\\"=2]>}"}')


@pytest.mark.parametrize("mesh, axes", [(_MESHES[0], "'batch'"),
                                        (_MESHES[1], "('x', 'y')")])
def test_the_suggested_split_names_the_users_mesh_axes(mesh, axes):
  before = _BEFORE_OPTIMIZATION.replace("HloModule dp_step, num_partitions=4", mesh)
  cap = Capture(module=hlo_audit.parse_hlo(_UNANNOTATED), hlo_text=_UNANNOTATED,
                pre_optimization=before)
  (f,) = hlo_audit.audit_hlo(cap).findings_of(FindingKind.REPLICATED_BUFFER)
  assert f.suggestion == f"NamedSharding(mesh, P({axes}, None)) for params['w']"


@pytest.mark.parametrize("before", [_BEFORE_OPTIMIZATION, None, "HloModule broken {"])
def test_replicated_parameters_read_from_the_hlo_before_optimization(before):
  cap = Capture(module=hlo_audit.parse_hlo(_UNANNOTATED), hlo_text=_UNANNOTATED,
                pre_optimization=before)
  found = hlo_audit.audit_hlo(cap).findings_of(FindingKind.REPLICATED_BUFFER)
  if before is not _BEFORE_OPTIMIZATION:
    # Nothing says the weight is replicated: no finding (an unreadable module
    # before optimization is no evidence either).
    assert found == ()
    return
  (f,) = found
  # 4 MiB held whole on each of 4 devices; x is split already.
  assert (f.boundary, f.ops, f.peak_saved) == ("w", ("params['w']",), 4 * MiB * 3 // 4)
  # No mesh in that text: the axis name is a placeholder.
  assert f.suggestion == "NamedSharding(mesh, P('data', None)) for params['w']"
