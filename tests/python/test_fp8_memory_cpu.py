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
from cute_moe import fp8_ffn
from cute_moe.bench.configs import CONFIGS

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
import memory_trace  # noqa: E402

pytestmark = pytest.mark.skipif(not cute_moe.library_loaded(),
                                reason="the op library is not loaded (its fake kernels)")


@pytest.mark.parametrize("fuse_gather", [False, True])
@pytest.mark.parametrize("name", ["gpt-oss-20b", "qwen3-30b-a3b", "gpt-oss-120b", "seed-example"])
def test_fp8_layer_peak_is_not_above_bf16(name, fuse_gather):
    """Both layers with the same fuse_gather, at every configuration of the benchmark: its
    weight gradients in FP8 at GPT-OSS-20B and the seed example without a fused gather, at
    GPT-OSS-20B with one (fp8_ffn.fp8_weight_grads_for), bf16 elsewhere."""
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
    a deep model) at least 0.9x that copy below, less x's 128x1 e4m3 copy where its weight
    gradients are FP8 (half the sorted copy's bytes: GPT-OSS-20B holds 1.47 GiB then, 1.19
    with bf16 weight gradients, bf16's layer 1.72)."""
    cfg = CONFIGS[name]
    peaks = memory_trace.layer_peaks(cfg, ["bf16", "fp8"])
    bf16, fp8 = peaks["bf16"], peaks["fp8"]
    sorted_copy = cfg.rows * cfg.hidden * 2
    # what the FP8 weight gradient keeps instead, where the block runs one (GPT-OSS-20B): x's
    # 128x1 e4m3 copy, (H, 128 blocks) bytes, and its fp32 scales (blocks, H)
    kept = 0
    if fp8_ffn.fp8_weight_grads_for(cfg.rows, cfg.experts, cfg.hidden, cfg.inter, gathered=True):
        blocks = (cfg.rows + 127) // 128 + cfg.experts
        kept = cfg.hidden * 128 * blocks + 4 * blocks * cfg.hidden
    assert fp8.peak <= bf16.peak - 0.8 * sorted_copy, (name, fp8.peak, bf16.peak, sorted_copy)
    assert 0 < fp8.held <= bf16.held - 0.9 * sorted_copy + kept, (name, fp8.held, bf16.held, sorted_copy, kept)
