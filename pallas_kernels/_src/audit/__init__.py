"""pallas_kernels as hlo-audit's kernel library: everything that reads hlo_audit.

The rest of pallas_kernels never imports hlo_audit; here, only its public
names (`hlo_audit`, `hlo_audit.plugins`) are used, so the auditor stands alone
and the kernels plug into it (`library.py`, found through the
`hlo_audit.kernel_libraries` entry point).
"""
