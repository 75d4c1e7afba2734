"""Pallas kernels with fused prologues and epilogues, each held against XLA."""

from pallas_kernels._src.ops.normalization.api import layer_norm as layer_norm
from pallas_kernels._src.ops.normalization.api import rms_norm as rms_norm
from pallas_kernels._src.ops.matmul.api import matmul as matmul
from pallas_kernels._src.ops.linear_cross_entropy.api import linear_cross_entropy as linear_cross_entropy
from pallas_kernels._src.ops.glu_matmul.api import glu_matmul as glu_matmul
from pallas_kernels._src.ops.adam_matmul.api import adam_matmul as adam_matmul
from pallas_kernels._src.ops.conv2d.api import conv2d as conv2d
from pallas_kernels._src.ops.conv2d_weight_grad.api import conv2d_weight_grad as conv2d_weight_grad
from pallas_kernels._src.ops.batch_norm.api import batch_norm as batch_norm
from pallas_kernels._src.ops.softmax.api import softmax as softmax
from pallas_kernels._src.validate import validate as validate
from pallas_kernels._src.validate import ValidationReport as ValidationReport
from pallas_kernels._src.bench import bench as bench
from pallas_kernels._src.bench import BenchReport as BenchReport
from pallas_kernels._src.spec import Case as Case
from pallas_kernels._src.spec import OpSpec as OpSpec
from pallas_kernels._src.registry import get_spec as get_spec
from pallas_kernels._src.cases import make_case as make_case
from pallas_kernels._src.guard import fallbacks as fallbacks
from pallas_kernels._src.guard import clear_fallbacks as clear_fallbacks
from pallas_kernels._src.swap.guard_check import check_guard as check_guard
from pallas_kernels._src.swap.guard_check import GuardCheck as GuardCheck
from pallas_kernels._src.swap.rewrite import swap as swap
from pallas_kernels._src.swap.report import SwapReport as SwapReport
from pallas_kernels._src.audit.verify import verify as verify
from pallas_kernels._src.audit.verify import VerificationReport as VerificationReport
