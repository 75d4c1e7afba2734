"""pallas_kernels as hlo-audit's kernel library: its answers are its specs'."""

from __future__ import annotations

import dataclasses
import inspect

import jax
import pytest

import hlo_audit
from hlo_audit import FindingKind
from hlo_audit import plugins
from pallas_kernels._src import registry
from pallas_kernels._src.audit import sweep
from pallas_kernels._src.audit.library import LIBRARY

E, P, R = (FindingKind.UNFUSED_EPILOGUE, FindingKind.UNFUSED_PROLOGUE,
           FindingKind.SEPARATE_REDUCTION)


class _Finding:
  """What `kernel_for` reads of a finding: its need, and whether its
  boundary stays stored for later readers."""

  def __init__(self, need, kept=False):
    self.need = need
    self.boundary_kept = kept


def _choose(kind, anchor, ops=(), kept=False, **kw):
  return LIBRARY.kernel_for(_Finding(plugins.KernelNeed(kind, anchor, ops, **kw), kept))


def test_it_is_a_kernel_library_and_the_entry_point_finds_it():
  assert isinstance(LIBRARY, plugins.KernelLibrary)
  found = plugins.installed_libraries(refresh=True)
  assert [lib.name for lib in found.libraries] == ["jax", "pallas_kernels"]
  assert found.libraries[1] is LIBRARY and not found.notes


@pytest.mark.parametrize("kind, anchor, ops, op", [
    (E, "dot", ("bias", "activation:gelu", "cast:bf16"), "pallas_kernels.matmul"),
    (E, "dot", ("residual", "clamp", "quantize:s8"), "pallas_kernels.matmul"),
    # A backward's dz = (dy @ w^T) * gelu'(z): the derivative fused on store.
    (E, "dot", ("activation_grad:gelu",), "pallas_kernels.matmul"),
    (E, "dot", ("scale", "activation_grad:silu", "cast:bf16"), "pallas_kernels.matmul"),
    (P, "dot", ("dequantize:s8", "scale"), "pallas_kernels.matmul"),
    (FindingKind.LAYOUT_CONFLICT, "dot", ("transpose",), "pallas_kernels.matmul"),
    (R, "layer_norm", (), "pallas_kernels.layer_norm"),
    (R, "rms_norm", (), "pallas_kernels.rms_norm"),
    (R, "softmax", (), "pallas_kernels.softmax"),
    (P, "rms_norm", ("residual",), "pallas_kernels.rms_norm"),
    (P, "convolution", ("affine", "activation:relu", "pad"), "pallas_kernels.conv2d"),
    (E, "convolution", ("bias", "activation:hard_swish"), "pallas_kernels.conv2d"),
    (R, "convolution", ("batch_norm_stats",), "pallas_kernels.conv2d"),
    (R, "convolution", ("column_sum",), "pallas_kernels.conv2d_weight_grad"),
    (E, "convolution", ("outputs:3", "adam", "transpose"),
     "pallas_kernels.conv2d_weight_grad"),
    (E, "convolution", ("bias", "activation:relu", "batch_norm_stats"),
     "pallas_kernels.conv2d"),
    (P, "convolution", ("affine", "activation:hard_swish", "pad"), "pallas_kernels.conv2d"),
])
def test_the_op_whose_spec_closes_the_need(kind, anchor, ops, op):
  assert _choose(kind, anchor, ops) == plugins.KernelChoice(op)


@pytest.mark.parametrize("dims", [(8, 16, 16, 72), (2, 4, 8, 8, 16)])
def test_a_batch_norms_backward_column_sums_are_batch_norms(dims):
  stats = plugins.Statistics(dims, tuple(range(len(dims) - 1)))
  assert _choose(R, "column_reduction", statistics=stats) == plugins.KernelChoice(
      "pallas_kernels.batch_norm")


@pytest.mark.parametrize("stats", [
    None,  # the backward's scale and shift gradients, column sums of [N, H, W, C]
    plugins.Statistics((8, 1024, 8, 4), (1, 3)),  # [N, HW, G, C/G] over HW and C/G
    plugins.Statistics((8, 32, 32, 8, 4), (1, 2, 4)),
    plugins.Statistics((8, 1024, 32), (1,)),  # an instance norm's: a group a channel
])
def test_a_group_norms_statistics_and_gradients_are_group_norms(stats):
  anchor = "group_norm_stats" if stats else "group_norm_backward"
  assert _choose(R, anchor, statistics=stats) == plugins.KernelChoice(
      "pallas_kernels.group_norm")


def test_per_sample_statistics_of_no_groups_are_not_group_norms():
  # Two kept axes besides the batch: no [N, ..., G, C/G] view of one image.
  stats = plugins.Statistics((8, 16, 8, 4), (1,))
  assert _choose(R, "group_norm_stats", statistics=stats).op is None


@pytest.mark.parametrize("kind, anchor, ops, kw, why", [
    # Work no op fuses: nothing came close.
    (E, "dot", ("bias", "activation:softplus"), {}, ""),
    (E, "dot", ("activation_grad:softplus",), {}, ""),
    (E, "dot", ("store into slice",), {}, ""),
    # Kinds no op computes say why the gap stays XLA's.
    (E, "convolution", ("slice", "mask"), {}, "no pallas_kernels convolution fuses"),
    (E, "convolution", ("clamp",), {}, "no pallas_kernels convolution fuses"),
    (P, "convolution", ("activation:softplus",), {}, "no pallas_kernels convolution fuses"),
    (R, "batch_norm_stats", (), {}, "no pallas_kernels kernel sums these batch statistics"),
    # A column sum that is no batch norm's: a dense bias's gradient (rank 2),
    # or one over the batch axis alone.
    (R, "column_reduction", (), {"statistics": plugins.Statistics((128, 64), (0,))},
     "no pallas_kernels op computes this column sum"),
    (R, "column_reduction", (), {"statistics": plugins.Statistics((8, 1, 1, 96), (0,))},
     "no pallas_kernels op computes this column sum"),
    # [B, T, D] over (0, 1): as often a dense layer's bias gradient over a sequence.
    (R, "column_reduction", (), {"statistics": plugins.Statistics((8, 32, 512), (0, 1))},
     "no pallas_kernels op computes this column sum"),
    (R, "column_reduction", (), {}, "no pallas_kernels op computes this column sum"),
    # Close, and why not.
    (E, "dot", ("bias",), {"outputs": 3}, "pallas_kernels.matmul writes one output"),
    # A convolution's transposed store with a second output is no update:
    # conv2d_weight_grad's family of findings that writes three requires adam.
    (E, "convolution", ("outputs:2", "transpose"), {"outputs": 2},
     "pallas_kernels.conv2d writes one output"),
    (FindingKind.MATERIALIZED_SLICE, "dot", ("concatenate",), {"reads_parts": True},
     "pallas_kernels.matmul takes whole operands"),
    (R, "log_softmax", (), {}, "pallas_kernels.softmax returns probabilities, not logs"),
])
def test_no_op_and_why(kind, anchor, ops, kw, why):
  choice = _choose(kind, anchor, ops, **kw)
  assert choice.op is None
  assert choice.why_not.startswith(why) if why else choice.why_not == ""


@pytest.mark.parametrize("ops", [("outputs:2", "activation:gelu"),
                                 ("outputs:1", "bias", "activation:gelu_tanh")])
def test_an_activations_values_for_the_backward_are_the_matmuls_own(ops):
  # XLA's reader writes the activation and values for its derivative while
  # the gradients keep the product stored: the matmul's forward stores its
  # product for its own backward, which recomputes the derivative from it.
  need = dict(outputs=int(ops[0].partition(":")[2]))
  assert _choose(E, "dot", ops, kept=True, **need).op == "pallas_kernels.matmul"
  # Nothing kept for a backward, or no derivative to take: several outputs.
  assert _choose(E, "dot", ops, kept=False, **need).op == (
      "pallas_kernels.matmul" if need["outputs"] == 1 else None)
  assert _choose(E, "dot", ("outputs:2", "bias"), kept=True, outputs=2).op is None


def test_each_ops_keywords_are_parameters_of_its_function():
  for spec in registry.specs().values():
    params = inspect.signature(spec.api).parameters
    for closes in spec.closings():
      for item, keyword in closes.keywords:
        assert keyword in params, (spec.name, item, keyword)


def test_every_op_offers_itself_to_sweeps_with_its_specs_parameters():
  targets = LIBRARY.sweep_targets()
  assert set(targets) == set(registry.spec_names())
  for name, target in targets.items():
    assert isinstance(target, plugins.KernelSweep)
    assert [p.name for p in target.params] == [
        p.name for p in registry.get_spec(name).sweep_params]
    assert all(isinstance(p, plugins.SweepParam) for p in target.params)


def test_a_suggestion_is_written_from_the_anchor_the_audit_read():
  x, w, b = (jax.ShapeDtypeStruct(s, "float32") for s in ((64, 256), (256, 512), (512,)))
  report = hlo_audit.audit(jax.jit(lambda x, w, b: jax.nn.relu(x @ w + b)), x, w, b)
  (f,) = report.findings_of(E)
  assert f.kernel == "pallas_kernels.matmul"
  assert f.suggestion == ("pallas_kernels.matmul(x, w, bias=bias, activation='relu')  "
                          "# x: f32[64,256], w: f32[256,512], bias: f32[512] -> f32[64,512]")
  assert f.guard_verdict.startswith("kernel runs (guard passes on ")


@pytest.mark.parametrize("fn,shapes,call", [
    (lambda x, w, b: jax.nn.relu(x.T @ w + b), ((256, 64), (256, 512)),
     "pallas_kernels.matmul(x, w, bias=bias, transpose_x=True, activation='relu')  "
     "# x: f32[256,64], w: f32[256,512], bias: f32[512] -> f32[64,512]"),
    (lambda x, w, b: jax.nn.relu(x @ w.T + b), ((64, 256), (512, 256)),
     "pallas_kernels.matmul(x, w, bias=bias, transpose_w=True, activation='relu')  "
     "# x: f32[64,256], w: f32[512,256], bias: f32[512] -> f32[64,512]"),
])
def test_a_suggestion_transposes_the_operand_the_dot_contracts_first(fn, shapes, call):
  # XLA folds x.T (w.T) into the dot's contracting dimensions: the call
  # reads the operand as stored and says which one the kernel transposes.
  x, w = (jax.ShapeDtypeStruct(s, "float32") for s in shapes)
  b = jax.ShapeDtypeStruct((512,), "float32")
  (f,) = hlo_audit.audit(jax.jit(fn), x, w, b).findings_of(E)
  assert f.suggestion == call


def test_a_prologue_suggestion_reads_the_operand_in_its_stored_dtype():
  # An int8 weight dequantized by a per-column scale before the matmul: the
  # kernel reads the int8 weight and its scale; the result is the dot's.
  x, w, s = (jax.ShapeDtypeStruct(*a) for a in
             (((64, 256), "float32"), ((256, 512), "int8"), ((512,), "float32")))
  fn = lambda x, w, s: x @ (w.astype(jax.numpy.float32) * s)  # noqa: E731
  (f,) = hlo_audit.audit(jax.jit(fn), x, w, s).findings_of(P)
  assert f.suggestion == ("pallas_kernels.matmul(x, w, w_scale=w_scale)  "
                          "# x: f32[64,256], w: s8[256,512] -> f32[64,512]")


@pytest.mark.parametrize("op", ["matmul", "layer_norm", "rms_norm", "softmax"])
def test_sweep_cases_have_the_grid_shapes(op):
  spec = registry.get_spec(op)
  if op == "matmul":
    case = sweep.build_case(spec, {"m": 8, "k": 16, "n": 24, "dtype": "bfloat16",
                                   "bias": True, "activation": "gelu", "grad": False}, 0)
    assert [a.shape for a in case.args] == [(8, 16), (16, 24), (24,)]
    assert case.kwargs["activation"] == "gelu" and case.args[0].dtype.name == "bfloat16"
  else:
    extra = {"residual": True} if op != "softmax" else {"causal": True}
    case = sweep.build_case(spec, {"rows": 6, "cols": 40, "grad": True, **extra}, 0)
    assert case.args[0].shape == (6, 40)
    assert case.grad_argnums == tuple(range(len(case.args)))
    assert len(case.args) == {"layer_norm": 4, "rms_norm": 3, "softmax": 1}[op]


def test_an_audit_alone_makes_no_kernel_inputs():
  spec = registry.get_spec("matmul")
  p = {"m": 4096, "k": 4096, "n": 4096, "dtype": "bfloat16", "w_dtype": "int8",
       "w_scale": "channel", "bias": True, "grad": False}
  case, nbytes, flops = sweep.kernel_case(spec, p, 0, concrete=False)
  assert all(not isinstance(a, jax.Array) for a in case.args)
  assert [a.shape for a in case.args] == [(4096, 4096), (4096, 4096), (4096,)]
  assert case.kwargs["w_scale"].shape == (4096,)
  # x, w, bias and the scales in; the bf16 product out.
  assert nbytes == 4096 * 4096 * (2 + 1 + 2) + 4096 * (2 + 4)
  assert flops == 2 * 4096 ** 3
  seen = []
  out = sweep.OpSweep(spec).run(p, plugins.Measure(),
                                lambda fn, args: seen.append(args) or {"seconds": {}})
  assert out["kernel"]["bytes_moved"] == nbytes
  assert "validation" not in out and "timing" not in out
  (args,) = seen
  assert [a.shape for a in args][:3] == [(4096, 4096), (4096, 4096), (4096,)]


def test_the_target_of_an_audited_module_is_what_it_names_or_none():
  import types  # pylint: disable=import-outside-toplevel
  from pallas_kernels._src import backend  # pylint: disable=import-outside-toplevel
  from pallas_kernels._src.audit.library import _module_target  # pylint: disable=import-outside-toplevel
  plain = types.SimpleNamespace()
  assert _module_target(plain) is None  # no device given: this process's
  assert _module_target(plain, types.SimpleNamespace(platform="rocm", name="mi300")) is None
  h200 = backend.resolve_target("NVIDIA H200")
  assert _module_target(types.SimpleNamespace(device_kind="NVIDIA H200")) == h200
  assert _module_target(plain, types.SimpleNamespace(platform="gpu", name="NVIDIA H200")) == h200
  # Facts of a platform the kernels do not target name no target, even by a
  # chip's name (facts copied from an H200's for a simulator, say).
  assert _module_target(plain, types.SimpleNamespace(platform="sim", name="NVIDIA H200")) is None
  assert _module_target(types.SimpleNamespace(device_kind="no such device")) is None


def test_an_op_that_reads_parts_in_place_is_not_refused_a_concatenate():
  from pallas_kernels._src.audit.library import _closes  # pylint: disable=import-outside-toplevel
  from pallas_kernels._src.spec import Closes  # pylint: disable=import-outside-toplevel
  need = plugins.KernelNeed(FindingKind.MATERIALIZED_SLICE, "dot", ("concatenate",),
                            reads_parts=True)
  whole = Closes(kinds=frozenset({"materialized-slice"}), anchors=frozenset({"dot"}))
  parts = dataclasses.replace(whole, reads_parts=True)
  assert _closes("pallas_kernels.x", whole, need, False) == (
      False, "pallas_kernels.x takes whole operands")
  assert _closes("pallas_kernels.x", parts, need, False)[1] != "pallas_kernels.x takes whole operands"


def test_an_op_without_a_suggestion_or_a_sweep_offers_none(monkeypatch):
  import types  # pylint: disable=import-outside-toplevel
  real = dict(registry.specs())
  quiet = dataclasses.replace(real["softmax"], suggest=None)
  unswept = dataclasses.replace(real["rms_norm"], sweep_params=())
  uncased = dataclasses.replace(real["layer_norm"], make_case=None)
  monkeypatch.setattr(registry, "specs", lambda: types.MappingProxyType(
      {**real, "softmax": quiet, "rms_norm": unswept, "layer_norm": uncased}))
  finding = types.SimpleNamespace(kernel="pallas_kernels.softmax")
  assert LIBRARY.suggest(finding, None) is None
  assert LIBRARY.suggest(types.SimpleNamespace(kernel="pallas_kernels.nope"), None) is None
  swept = set(LIBRARY.sweep_targets())
  assert {"softmax", "matmul"} <= swept and not {"rms_norm", "layer_norm"} & swept


def test_a_findings_matmul_is_its_writer_for_an_epilogue_its_reader_for_a_prologue():
  import types  # pylint: disable=import-outside-toplevel
  from pallas_kernels._src.audit.library import _facts  # pylint: disable=import-outside-toplevel
  module = hlo_audit.parse_hlo(
      "HloModule m, is_scheduled=true\n\nENTRY e {\n"
      "  x = f32[64,32]{1,0} parameter(0)\n  w = f32[32,16]{1,0} parameter(1)\n"
      "  v = f32[16,8]{1,0} parameter(2)\n"
      "  d = f32[64,16]{1,0} dot(x, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}\n"
      "  t = f32[64,16]{1,0} tanh(d)\n"
      "  ROOT e2 = f32[64,8]{1,0} dot(t, v), lhs_contracting_dims={1}, rhs_contracting_dims={0}\n"
      "}\n")

  def facts(kind, producer, consumers):
    return _facts(types.SimpleNamespace(kind=kind, need=None, computation="e", producer=producer,
                                        consumers=consumers, ops=(), boundary_shape="f32[64,16]"),
                  module)

  assert facts(FindingKind.UNFUSED_EPILOGUE, "d", ("t",)).matmul.rhs.dims == (32, 16)
  assert facts(FindingKind.UNFUSED_PROLOGUE, "t", ("e2",)).matmul.rhs.dims == (16, 8)
  # Neither: a separate reduction's reader is no matmul of its own; nor a
  # prologue read by nothing the audit names.
  assert facts(FindingKind.SEPARATE_REDUCTION, "t", ("e2",)).matmul is None
  assert facts(FindingKind.UNFUSED_PROLOGUE, "t", ()).matmul is None


def test_a_pad_before_a_dot_is_no_convolutions_padding():
  import types  # pylint: disable=import-outside-toplevel
  from pallas_kernels._src.audit.library import _facts  # pylint: disable=import-outside-toplevel
  module = hlo_audit.parse_hlo(
      "HloModule m, is_scheduled=true\n\nENTRY e {\n"
      "  x = f32[60,32]{1,0} parameter(0)\n  w = f32[32,16]{1,0} parameter(1)\n"
      "  z = f32[] constant(0)\n"
      "  p = f32[64,32]{1,0} pad(x, z), padding=0_4x0_0\n"
      "  ROOT d = f32[64,16]{1,0} dot(p, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}\n"
      "}\n")

  def facts(anchor, consumers=("d",)):
    need = plugins.KernelNeed(FindingKind.UNFUSED_PROLOGUE, anchor, ("pad",))
    return _facts(types.SimpleNamespace(
        kind=FindingKind.UNFUSED_PROLOGUE, need=need, computation="e", producer="p",
        consumers=consumers, ops=("pad",), boundary_shape="f32[64,32]"), module)

  # A dot's prologue: its matmul, and no convolution nor padding read for one.
  dot = facts("dot")
  assert dot.matmul is not None and (dot.convolution, dot.pad) == (None, None)
  # The same pad asked as a convolution's prologue: its widths are read.
  _, widths = facts("convolution").pad
  assert widths == ((0, 4), (0, 0))
  # Read by nothing the audit names: the convolution is looked for at the
  # writer (a pad, so none), and the widths still read.
  alone = facts("convolution", consumers=())
  assert alone.convolution is None and alone.pad[1] == ((0, 4), (0, 0))


def test_a_convolutions_epilogue_reads_the_convolution_that_writes_it():
  import types  # pylint: disable=import-outside-toplevel
  from pallas_kernels._src.audit.library import _facts  # pylint: disable=import-outside-toplevel
  module = hlo_audit.parse_hlo(
      "HloModule m, is_scheduled=true\n\nENTRY e {\n"
      "  x = f32[1,8,8,4]{3,2,1,0} parameter(0)\n  k = f32[3,3,4,16]{3,2,1,0} parameter(1)\n"
      "  c = f32[1,8,8,16]{3,2,1,0} convolution(x, k), window={size=3x3 pad=1_1x1_1}, "
      "dim_labels=b01f_01io->b01f\n"
      "  ROOT t = f32[1,8,8,16]{3,2,1,0} tanh(c)\n}\n")
  need = plugins.KernelNeed(FindingKind.UNFUSED_EPILOGUE, "convolution", ("activation:tanh",))
  finding = types.SimpleNamespace(kind=FindingKind.UNFUSED_EPILOGUE, need=need, computation="e",
                                  producer="c", consumers=("t",), ops=("activation:tanh",),
                                  boundary_shape="f32[1,8,8,16]")
  conv = _facts(finding, module).convolution
  assert conv is not None and conv.kernel.dims == (3, 3, 4, 16)
