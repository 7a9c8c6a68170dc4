# GPU tests of the FP8 ragged-M grouped GEMM (torch.ops.cute_moe.grouped_mm_fp8 and
# cute_moe.fp8.grouped_mm) against the fp32 reference on the same quantized inputs
# (reference_grouped_mm_fp8 before its bf16 rounding): GPT-OSS-like shapes, k and n not
# multiples of 128, empty groups (first and last too), padding rows (poisoned inputs, zero
# outputs), bias and row scales, both layouts of the weight's scales; no host sync, CUDA-graph
# replay with new routing, torch.compile, and the op's own argument checks. Needs an SM90 GPU
# and the compiled library.
import pytest
import torch

import cute_moe
from cute_moe import testing
from cute_moe.reference import offsets_from_counts

from fp8_gemm_cases import BF16, check_output, make_problem

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    pytest.mark.skipif(not cute_moe.library_loaded(), reason="cute_moe op library not loaded"),
    pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.get_device_capability() != (9, 0),
                       reason="the FP8 kernels run on SM90 (H100, H200)"),
]


def _counts(total, groups, routing, seed):
    return testing.group_sizes(total, groups, routing, generator=torch.Generator().manual_seed(seed))


# name: (counts per group, k, n, padding rows)
CASES = {
    # GPT-OSS's up-projection (hidden 2880 = 22.5 k-blocks, 2 x 2880 gated columns), 4 experts
    "gpt_oss": ([300, 0, 517, 180], 2880, 5760, 3),
    # the down-projection's shape: n = 2880 not a multiple of 128 either
    "gpt_oss_down": ([0, 250, 250, 0], 2880, 2880, 0),
    # one short k-block, n not a multiple of 128, first and last groups empty
    "k80_n200": ([0, 37, 64, 0], 80, 200, 5),
    "k2880_n200": ([129, 0, 0, 255, 1, 0, 77, 0], 2880, 200, 0),
    # many groups, skewed routing with empty ones
    "e64_skewed": (_counts(1500, 64, "skewed", 1), 512, 1024, 17),
    "e128_empty": (_counts(700, 128, "empty", 2), 256, 384, 0),
    # the smallest k, n a multiple of 8 only
    "k16_n24": ([50, 0, 13], 16, 24, 2),
    "k208_n8": ([3, 129, 0, 1], 208, 8, 1),
    "one_row": ([1], 128, 128, 0),
    "tile_edges": ([128, 129, 127, 256], 384, 264, 1),
    "all_padding": ([0, 0, 0], 256, 256, 9),
    "no_rows": ([0, 0], 128, 64, 0),
}


@pytest.mark.parametrize("w_scale", ["as_is", "t"])
@pytest.mark.parametrize("row_scale", [False, True], ids=["", "row_scale"])
@pytest.mark.parametrize("bias", [False, True], ids=["", "bias"])
@pytest.mark.parametrize("case", list(CASES))
def test_matches_reference(case, bias, row_scale, w_scale):
    counts, k, n, pad = CASES[case]
    p = make_problem(counts, k, n, pad=pad, bias=bias, row_scale=row_scale, w_scale=w_scale,
                     device="cuda", seed=k + n + len(counts))
    assert p.w.stride(1) == 1
    out = torch.ops.cute_moe.grouped_mm_fp8(*p.args())
    torch.cuda.synchronize()
    check_output(out, p, name=case)


def test_public_function_and_no_host_sync():
    p = make_problem([40, 0, 300, 7], 2880, 640, pad=5, bias=True, row_scale=True, device="cuda", seed=3)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        out = cute_moe.fp8.grouped_mm(*p.args())
    finally:
        torch.cuda.set_sync_debug_mode(0)
    check_output(out, p)
    assert torch.equal(out, torch.ops.cute_moe.grouped_mm_fp8(*p.args()))  # deterministic


def test_cuda_graph_replay_with_new_routing():
    m, k, n, groups = 1000, 2880, 768, 8
    p = make_problem(_counts(m - 11, groups, "balanced", 4), k, n, pad=11, bias=True, row_scale=True,
                     device="cuda", seed=4, poison=False)
    graph, out = testing.capture_graph(lambda: torch.ops.cute_moe.grouped_mm_fp8(*p.args()))
    g = torch.Generator().manual_seed(5)
    for routing, pad in (("skewed", 0), ("empty", 40), ("single", 300), ("balanced", m)):
        p.counts = testing.group_sizes(m - pad, groups, routing, generator=g)
        p.offs.copy_(offsets_from_counts(p.counts, device="cuda"))  # the same tensor, new contents
        graph.replay()
        torch.cuda.synchronize()
        check_output(out, p, name=f"replay {routing}")


def test_torch_compile_fullgraph():
    p = make_problem([0, 77, 300, 0, 120], 2880, 256, pad=4, bias=True, row_scale=True, device="cuda", seed=6)
    compiled = torch.compile(cute_moe.fp8.grouped_mm, fullgraph=True)
    out = compiled(*p.args())
    check_output(out, p)
    assert torch.equal(out, cute_moe.fp8.grouped_mm(*p.args()))
    q = make_problem([5, 0, 60, 3, 9], 2880, 256, pad=1, device="cuda", seed=7)  # a second call, no bias
    check_output(compiled(q.x, q.x_scale, q.w, q.w_scale, q.offs), q)


def _bad_inputs():
    """(name, args) pairs, each breaking one rule the CUDA op checks itself."""
    p = make_problem([6, 0, 10], 256, 128, pad=2, bias=True, row_scale=True, device="cuda", seed=8)
    a = dict(zip(("x", "x_scale", "w", "w_scale", "offs", "bias", "row_scale"), p.args()))
    cuda = dict(device="cuda")
    return [
        ("w", dict(a, w=p.w.contiguous())),                                  # row-major: not k-contiguous
        ("w", dict(a, w=p.w.to(torch.float32).to(BF16))),                   # bf16
        ("x", dict(a, x=p.x.float().to(BF16))),
        ("x_scale", dict(a, x_scale=p.x_scale[:, :1])),
        ("x_scale", dict(a, x_scale=p.x_scale[:-1])),
        ("w_scale", dict(a, w_scale=torch.ones(3, 1, 1, **cuda))),
        ("offs", dict(a, offs=p.offs.long())),
        ("offs", dict(a, offs=p.offs[:2])),
        ("offs", dict(a, offs=p.offs.cpu())),                                # another device
        ("bias", dict(a, bias=torch.zeros(3, 136, dtype=BF16, **cuda))),
        ("row_scale", dict(a, row_scale=p.row_scale[:-1])),
        ("row_scale", dict(a, row_scale=p.row_scale.to(BF16))),
    ]


@pytest.mark.parametrize("index", range(12))
def test_op_rejects_bad_input(index):
    name, args = _bad_inputs()[index]
    with pytest.raises((RuntimeError, ValueError), match=rf"\b{name}\b"):
        torch.ops.cute_moe.grouped_mm_fp8(**args)
    torch.cuda.synchronize()
    # the public function's Python checks say the same first
    with pytest.raises(ValueError, match=rf"cute_moe\.grouped_mm_fp8: {name}: expected"):
        cute_moe.fp8.grouped_mm(**args)


def test_op_rejects_k_not_a_multiple_of_16():
    x = torch.randn(8, 40, device="cuda").to(torch.float8_e4m3fn)
    w = torch.randn(2, 16, 40, device="cuda").to(torch.float8_e4m3fn).transpose(-2, -1)
    args = (x, torch.ones(8, 1, device="cuda"), w, torch.ones(2, 1, 1, device="cuda"),
            torch.tensor([3, 8], dtype=torch.int32, device="cuda"))
    with pytest.raises((RuntimeError, ValueError), match=r"\bk\b"):
        torch.ops.cute_moe.grouped_mm_fp8(*args)
    with pytest.raises(ValueError, match=r"x: expected k = x.shape\[1\] a positive multiple of 16"):
        cute_moe.fp8.grouped_mm(*args)

