# The fused up projection alone (torch.ops.cute_moe.grouped_mm_act, median of 30 calls) on
# the weight placements the kernels read in place: GPT-OSS-20B interleaved with its bias
# (swiglu_oai); Qwen3-30B-A3B's [gate | linear] halves as one tensor, and as the pair of two
# tensors (torchtitan's w1, w3) with the linear one above or below the gate one (below: the
# swapped-pair load, session 24; a library from before it joins that pair, a copy inside the
# timed call). The last field checks the pair below against the one tensor bit for bit. One
# line per run: run it once per library (CUTE_MOE_LIBRARY, TAG names the line) to compare.
#   TAG=new python3 bench/bench_act_forward_pair.py
import os

import torch

from common import import_cute_moe

import_cute_moe()
ops = torch.ops.cute_moe
torch.manual_seed(0)
def offs_for(m, e):
    return torch.full((e,), m // e, dtype=torch.int32, device="cuda").cumsum(0).int()
def timed(fn, n=30):
    for _ in range(5): fn()
    ev = []
    for _ in range(n):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record(); fn(); e.record(); ev.append((s, e))
    torch.cuda.synchronize()
    return sorted(a.elapsed_time(b) for a, b in ev)[n // 2]
res = []
m, h, i, e = 98304, 2880, 2880, 32
x = torch.randn(m, h, device="cuda").bfloat16()
w = (torch.randn(e, h, 2 * i, device="cuda") * 0.02).bfloat16()
b = torch.randn(e, 2 * i, device="cuda").bfloat16()
o = offs_for(m, e)
res.append(("gpt-oss up", timed(lambda: ops.grouped_mm_act(x, w, o, b, None, "swiglu_oai", 1.702, 7.0))))
del x, w, b
m, h, i, e = 131072, 2048, 768, 128
x = torch.randn(m, h, device="cuda").bfloat16()
o = offs_for(m, e)
buf = (torch.randn(2, e, i, h, device="cuda") * 0.02).bfloat16()
joined = torch.cat([buf[0], buf[1]], 1)  # (E, 2I, H)
res.append(("qwen3 halves", timed(lambda: ops.grouped_mm_act(x, joined.transpose(1, 2), o, None, None, "swiglu", 1.702, None, "halves"))))
above = (buf[0].transpose(1, 2), buf[1].transpose(1, 2))
below = (buf[1].transpose(1, 2), buf[0].transpose(1, 2))
res.append(("qwen3 pair above", timed(lambda: ops.grouped_mm_act(x, above[0], o, None, None, "swiglu", 1.702, None, "halves", above[1]))))
res.append(("qwen3 pair below", timed(lambda: ops.grouped_mm_act(x, below[0], o, None, None, "swiglu", 1.702, None, "halves", below[1]))))
# bits: below == joined-order equivalent
h1, p1 = ops.grouped_mm_act(x, below[0], o, None, None, "swiglu", 1.702, None, "halves", below[1])
h2, p2 = ops.grouped_mm_act(x, torch.cat([buf[1], buf[0]], 1).transpose(1, 2), o, None, None, "swiglu", 1.702, None, "halves")
print(os.environ.get("TAG"), " | ".join(f"{n} {t*1e3:.0f} us" for n, t in res), "| below == joined:", torch.equal(h1, h2) and torch.equal(p1, p2))
