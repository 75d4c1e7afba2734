"""For kernel libraries: the interface hlo-audit consults, and what it reads
of the HLO for them.

A kernel library implements `KernelLibrary` and advertises it under the
`hlo_audit.kernel_libraries` entry-point group of its `pyproject.toml`, the
way JAX finds its PJRT plugins:

    [project.entry-points."hlo_audit.kernel_libraries"]
    my_kernels = "my_kernels.audit:LIBRARY"

The audit then asks it which of its ops closes each finding (`kernel_for`,
given the finding's `need`), for a ready-to-paste call with the finding's
shapes (`suggest`, reading the anchor with `matmul_anchor` or
`convolution_anchor`, `operand_arrays`, `pad_widths` and `norm_epsilon`),
and for the ops sweeps can target (`sweep_targets`);
`hlo-audit example --swap` calls its `swap` and `verify`. A library that
fails to load is a note in the report; with none installed, every finding
still names the kernel it needs.
"""

from hlo_audit._src.analysis.anchors import ArraySpec as ArraySpec
from hlo_audit._src.analysis.anchors import ConvolutionAnchor as ConvolutionAnchor
from hlo_audit._src.analysis.anchors import convolution_anchor as convolution_anchor
from hlo_audit._src.analysis.anchors import MatmulAnchor as MatmulAnchor
from hlo_audit._src.analysis.anchors import matmul_anchor as matmul_anchor
from hlo_audit._src.analysis.anchors import norm_epsilon as norm_epsilon
from hlo_audit._src.analysis.anchors import operand_arrays as operand_arrays
from hlo_audit._src.analysis.anchors import pad_widths as pad_widths
from hlo_audit._src.analysis.anchors import parse_array as parse_array
from hlo_audit._src.analysis.kernel_library import ENTRY_POINT_GROUP as ENTRY_POINT_GROUP
from hlo_audit._src.analysis.kernel_library import KernelChoice as KernelChoice
from hlo_audit._src.analysis.kernel_library import KernelLibrary as KernelLibrary
from hlo_audit._src.analysis.kernel_library import KernelSweep as KernelSweep
from hlo_audit._src.analysis.kernel_library import Libraries as Libraries
from hlo_audit._src.analysis.kernel_library import Suggestion as Suggestion
from hlo_audit._src.analysis.kernel_library import installed_libraries as installed_libraries
from hlo_audit._src.analysis.records import KernelNeed as KernelNeed
from hlo_audit._src.analysis.records import Statistics as Statistics
from hlo_audit._src.hlo.dtypes import to_numpy as numpy_dtype_name
from hlo_audit._src.sweep.targets import Measure as Measure
from hlo_audit._src.sweep.targets import Param as SweepParam
