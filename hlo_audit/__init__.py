"""hlo-audit: see what XLA materializes, and close the gaps with Pallas kernels."""

from hlo_audit._src.errors import CaptureError as CaptureError
from hlo_audit._src.errors import DumpError as DumpError
from hlo_audit._src.errors import HloAuditError as HloAuditError
from hlo_audit._src.errors import HloParseError as HloParseError
from hlo_audit._src.hlo.ir import Computation as Computation
from hlo_audit._src.hlo.ir import HloModule as HloModule
from hlo_audit._src.hlo.ir import Instruction as Instruction
from hlo_audit._src.hlo.ir import Layout as Layout
from hlo_audit._src.hlo.ir import Metadata as Metadata
from hlo_audit._src.hlo.ir import Shape as Shape
from hlo_audit._src.hlo.ir import SourceLocation as SourceLocation
from hlo_audit._src.hlo.parser import parse_hlo as parse_hlo
from hlo_audit._src.hlo.parser import parse_hlo_file as parse_hlo_file
from hlo_audit._src.hlo.parser import parse_shape as parse_shape
from hlo_audit._src.capture.capture import Capture as Capture
from hlo_audit._src.capture.capture import MemoryStats as MemoryStats
from hlo_audit._src.capture.capture import capture as capture
from hlo_audit._src.capture.dump import Dump as Dump
from hlo_audit._src.capture.dump import DumpedModule as DumpedModule
from hlo_audit._src.capture.dump import load_dump as load_dump
