"""The matmul op: Pallas kernels with a dequantizing prologue and fused epilogue."""

from pallas_kernels._src.ops.matmul.api import matmul as matmul
