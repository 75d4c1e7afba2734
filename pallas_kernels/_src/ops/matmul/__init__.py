"""The matmul op: Pallas kernels with a dequantizing prologue and fused epilogue."""
