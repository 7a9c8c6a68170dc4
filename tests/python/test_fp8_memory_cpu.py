# Issue 14's memory bar without a GPU: one forward + backward of cute_moe.nn.MoE with FP8 experts
# allocates at most the bf16 layer's peak, at the benchmark's GPT-OSS-20B and Qwen3-30B-A3B
# configurations, counted on meta tensors through the ops' fake kernels (bench/memory_trace.py:
# the bytes of live tensors, as the GPU's max_memory_allocated counts them less its rounding).
# test_fp8_precision.py measures the same bar on an SM90 GPU at a smaller layer.
import os
import sys

import pytest
import torch

import cute_moe
from cute_moe.bench.configs import CONFIGS

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
import memory_trace  # noqa: E402

pytestmark = pytest.mark.skipif(not cute_moe.library_loaded(),
                                reason="the op library is not loaded (its fake kernels)")


@pytest.mark.parametrize("fuse_gather", [False, True])
@pytest.mark.parametrize("name", ["gpt-oss-20b", "qwen3-30b-a3b"])
def test_fp8_layer_peak_is_not_above_bf16(name, fuse_gather):
    """Both layers with the same fuse_gather."""
    cfg = CONFIGS[name]
    peaks = memory_trace.layer_peaks(cfg, ["bf16", "fp8"], fuse_gather)
    bf16, fp8 = peaks["bf16"].peak, peaks["fp8"].peak
    # the tracker sees the block's activations: pre and its gradient alone are 2 * M * 2I bf16
    assert bf16 > 2 * cfg.rows * 2 * cfg.inter * 2, bf16
    assert fp8 <= bf16, (f"{name}: FP8 layer peak {fp8} B above bf16's {bf16} B; live at the "
                         f"FP8 peak: {peaks['fp8'].at_peak[:8]}")
    assert not torch.empty(1, device="meta").is_cuda  # the trace's is_cuda override is undone


@pytest.mark.parametrize("name", ["gpt-oss-20b", "qwen3-30b-a3b"])
def test_fp8_layer_default_gathers_in_its_quantizer(name):
    """MoE's default fuse_gather: on in FP8 (the gather joins x's quantization), off in bf16;
    the FP8 layer's peak then lies at least 0.8x the sorted copy of the tokens (M x H bf16)
    below the bf16 layer's, and what it holds from the forward to the backward (per layer, in
    a deep model) at least 0.9x that copy below."""
    cfg = CONFIGS[name]
    peaks = memory_trace.layer_peaks(cfg, ["bf16", "fp8"])
    bf16, fp8 = peaks["bf16"], peaks["fp8"]
    sorted_copy = cfg.rows * cfg.hidden * 2
    assert fp8.peak <= bf16.peak - 0.8 * sorted_copy, (name, fp8.peak, bf16.peak, sorted_copy)
    assert 0 < fp8.held <= bf16.held - 0.9 * sorted_copy, (name, fp8.held, bf16.held, sorted_copy)
