#!/usr/bin/env python3
# Whether a kernel is power-bound: each kernel of the GPT-OSS-20B down projection's backward
# (bf16 and FP8, plain GEMM and fused activation backward; the FP8 fused backward on its
# default pingpong tile and on the cooperative one) runs back to back for a few seconds while
# nvidia-smi samples the SM clock and the board power every 50 ms; prints ms per call and the
# settled medians. A kernel held at the board's power limit with its SM clock below the
# maximum is power-bound: there, time follows energy (bytes moved, instructions, tensor-core
# work) more than the overlap of its phases (docs/perf-notes.md, session 43).
#   python3 bench/bench_power.py [--seconds 3]
from __future__ import annotations

import argparse
import subprocess
import time

import torch

from bench_fp8_gemm import SHAPES, forced
from common import import_cute_moe


def smi(*fields: str, period_ms: int | None = None):
    cmd = ["nvidia-smi", "--query-gpu=" + ",".join(fields), "--format=csv,noheader,nounits"]
    if period_ms is not None:
        return subprocess.Popen(cmd + ["-lms", str(period_ms)], stdout=subprocess.PIPE, text=True)
    return subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=True).stdout.strip()


def kernels(fp8):
    """{name: call} on one set of GPT-OSS-20B operands (balanced routing)."""
    s = SHAPES["gpt-oss-20b"]
    H, I, E = s["hidden"], s["inter"], s["experts"]
    m = s["tokens"] * s["topk"]
    torch.manual_seed(0)
    offs = (torch.arange(1, E + 1, device="cuda") * (m // E)).int()
    dy = torch.randn(m, H, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(E, I, H, device="cuda", dtype=torch.bfloat16) * 0.02  # W_down
    pre = torch.randn(m, 2 * I, device="cuda", dtype=torch.bfloat16)
    prob = torch.rand(m, device="cuda")
    bias = torch.randn(E, H, device="cuda", dtype=torch.bfloat16)
    dq, ds = fp8.quantize_1x128(dy)
    q, q_scale = fp8.quantize_128x128(w)[:2]
    wq, wsc = q.transpose(-2, -1), q_scale.transpose(-2, -1)
    wt = w.transpose(-2, -1)

    def fp8_bwd():
        return fp8.grouped_mm_act_bwd_unchecked(dq, ds, wq, wsc, offs, pre, prob, bias, dy, True, "swiglu_oai",
                                                1.702, 7.0)

    return {
        "bf16 plain GEMM": lambda: torch.ops.cute_moe.grouped_mm(dy, wt, offs),
        "bf16 fused backward": lambda: torch.ops.cute_moe.grouped_mm_act_bwd(
            dy, wt, offs, pre, None, prob, bias, True, "swiglu_oai", 1.702, 7.0, "interleaved", False),
        "fp8 plain GEMM": lambda: fp8.grouped_mm_unchecked(dq, ds, wq, wsc, offs),
        "fp8 fused backward (default)": fp8_bwd,
        "fp8 fused backward (coop)": forced("128x128x128_2x1_coop", fp8_bwd),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seconds", type=float, default=3.0)
    args = ap.parse_args()
    fp8 = import_cute_moe().fp8
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}; max SM clock, power limit: "
          f"{smi('clocks.max.sm', 'power.limit')}")
    for name, fn in kernels(fp8).items():
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        sampler = smi("clocks.sm", "power.draw", period_ms=50)
        time.sleep(0.3)
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0, calls = time.time(), 0
        start.record()
        while time.time() - t0 < args.seconds:
            for _ in range(20):
                fn()
            calls += 20
            torch.cuda.synchronize()
        stop.record()
        torch.cuda.synchronize()
        sampler.terminate()
        lines = sampler.communicate()[0].strip().splitlines()
        samples = [tuple(float(v) for v in line.split(",")) for line in lines if "," in line]
        samples = samples[len(samples) // 4:]  # the first quarter: the clock still settling
        clock = sorted(s[0] for s in samples)[len(samples) // 2]
        power = sorted(s[1] for s in samples)[len(samples) // 2]
        print(f"{name:30s} {start.elapsed_time(stop) / calls:6.3f} ms a call  SM clock {clock:5.0f} MHz  "
              f"power {power:4.0f} W  ({len(samples)} samples)")


if __name__ == "__main__":
    main()
