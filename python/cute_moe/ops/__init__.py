"""The torch.ops.cute_moe ops by feature: gemm.py (grouped GEMMs), glu.py (the GEMMs with a
fused activation), permute.py (the row gathers of the dispatch and combine), fp8.py (the FP8
quantizers and GEMMs). Each checks
the arguments of its ops and, when the op library is loaded, registers their fake, CPU and
autograd kernels on import; checks.py holds the checks they share and registry.py the
registration. The schemas and CUDA kernels are the library's (src/torch/*.cpp).

Nothing is imported here: cute_moe/__init__.py imports the feature modules, so
importing this package alone has no side effects and cannot form an import cycle."""
