# GPU tests of the FP8 weight-gradient GEMM (torch.ops.cute_moe.grouped_mm_fp8_wgrad and
# cute_moe.fp8.grouped_mm_wgrad) on quantize_fp8_128x1's operands (b's with tile_scales),
# against the fp32 reference on the same quantized inputs: GPT-OSS-like shapes, k and n not
# multiples of 128, groups at and around the 128-row block edges, empty groups (exact zeros,
# also with every group empty and with no rows at all), the blocks no group uses poisoned, the
# output's memory poisoned; both tile schedules (static, dynamic), no host sync, CUDA-graph
# replay with new routing, torch.compile, against the bf16 weight gradient, and the op's own
# argument checks. Needs an SM90 GPU and the compiled library.
import pytest
import torch

import cute_moe
from cute_moe import testing
from cute_moe.reference import offsets_from_counts

from fp8_wgrad_cases import BF16, check_wgrad, make_wgrad_problem

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    pytest.mark.skipif(not cute_moe.library_loaded(), reason="cute_moe op library not loaded"),
    pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.get_device_capability() != (9, 0),
                       reason="the FP8 kernels run on SM90 (H100, H200)"),
]


def _counts(total, groups, routing, seed):
    return testing.group_sizes(total, groups, routing, generator=torch.Generator().manual_seed(seed))


def _poison(*shapes):
    """NaN in freed allocator blocks of these shapes: an output reusing one shows what it
    leaves unwritten."""
    blocks = [torch.full(s, float("nan"), dtype=BF16, device="cuda") for s in shapes]
    del blocks


# name: (counts per group, k, n, padding rows)
CASES = {
    # GPT-OSS-20B's up projection's weight (hidden 2880 = 22.5 tiles, 2 x 2880 columns)
    "gpt_oss_up": ([300, 0, 517, 180], 2880, 5760, 3),
    "gpt_oss_down": ([0, 250, 250, 0], 2880, 2880, 0),
    # deep groups: many k-tiles per output tile (the dynamic schedule's case)
    "deep": ([3000, 1100, 0], 256, 512, 0),
    # the groups' rows at and around the 128-row block edges
    "block_edges": ([128, 129, 127, 256, 1], 384, 272, 1),
    "k16_n16": ([50, 0, 13], 16, 16, 2),
    "e64_skewed": (_counts(1500, 64, "skewed", 1), 512, 1024, 17),
    "e128_empty": (_counts(700, 128, "empty", 2), 256, 384, 0),
    "one_row": ([1], 128, 128, 0),
    "every_group_empty": ([0, 0, 0], 256, 256, 9),
    "no_rows": ([0, 0], 128, 64, 0),
}


@pytest.mark.parametrize("schedule", ["s", "d"])
@pytest.mark.parametrize("case", list(CASES))
def test_matches_reference(case, schedule, monkeypatch):
    monkeypatch.setenv("CUTE_MOE_SCHEDULE", schedule)
    counts, k, n, pad = CASES[case]
    p = make_wgrad_problem(counts, k, n, pad=pad, device="cuda", seed=k + n + len(counts))
    _poison((len(counts), k, n))
    out = torch.ops.cute_moe.grouped_mm_fp8_wgrad(*p.args())
    torch.cuda.synchronize()
    check_wgrad(out, p, name=f"{case} ({schedule})")


def test_public_function_no_host_sync_and_deterministic():
    p = make_wgrad_problem([40, 0, 300, 7, 1200], 2880, 640, pad=5, device="cuda", seed=3)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        out = cute_moe.fp8.grouped_mm_wgrad(*p.args())
    finally:
        torch.cuda.set_sync_debug_mode(0)
    check_wgrad(out, p)
    for _ in range(3):  # the dynamic schedule hands tiles out in any order: the same bits
        assert torch.equal(out, torch.ops.cute_moe.grouped_mm_fp8_wgrad(*p.args()))


def test_close_to_the_bf16_weight_gradient():
    # e4m3 rounding of both operands, each 128-row block scaled by its amax: a few percent
    p = make_wgrad_problem([700, 0, 1300, 64], 2880, 1024, device="cuda", seed=9, poison=False)
    bf16, _ = torch.ops.cute_moe.grouped_mm_wgrad(p.x, p.dy, p.offs)
    out = cute_moe.fp8.grouped_mm_wgrad(*p.args())
    testing.assert_rel_close(out, bf16.float(), "fp8 against bf16 weight gradient", tol=6e-2)


def test_cuda_graph_replay_with_new_routing():
    m, k, n, groups = 2000, 512, 768, 8
    g = torch.Generator(device="cuda").manual_seed(4)
    x = torch.randn(m, k, generator=g, device="cuda").to(BF16)
    dy = torch.randn(m, n, generator=g, device="cuda").to(BF16)
    offs = offsets_from_counts(_counts(m, groups, "balanced", 4), device="cuda")

    def step():  # quantize both operands and reduce, as a training step's backward does
        a_t, a_s = cute_moe.fp8.quantize_128x1(x, offs)
        b_t, b_s = cute_moe.fp8.quantize_128x1(dy, offs, tile_scales=True)
        return torch.ops.cute_moe.grouped_mm_fp8_wgrad(a_t, a_s, b_t, b_s, offs)

    graph, out = testing.capture_graph(step)
    rng = torch.Generator().manual_seed(5)
    for routing, pad in (("skewed", 0), ("empty", 40), ("single", 300), ("balanced", m)):
        counts = testing.group_sizes(m - pad, groups, routing, generator=rng)
        offs.copy_(offsets_from_counts(counts, device="cuda"))  # the same tensor, new contents
        graph.replay()
        torch.cuda.synchronize()
        a_t, a_s = cute_moe.fp8.quantize_128x1(x, offs)
        b_t, b_s = cute_moe.fp8.quantize_128x1(dy, offs, tile_scales=True)
        assert torch.equal(out, torch.ops.cute_moe.grouped_mm_fp8_wgrad(a_t, a_s, b_t, b_s, offs)), routing
        assert bool((out[torch.tensor(counts, device="cuda") == 0] == 0).all()), routing


def test_torch_compile_fullgraph():
    p = make_wgrad_problem([0, 77, 300, 0, 120], 2880, 256, pad=4, device="cuda", seed=6)
    compiled = torch.compile(cute_moe.fp8.grouped_mm_wgrad, fullgraph=True)
    out = compiled(*p.args())
    check_wgrad(out, p)
    assert torch.equal(out, cute_moe.fp8.grouped_mm_wgrad(*p.args()))


def _bad_inputs():
    """(name, args) pairs, each breaking one rule the CUDA op checks itself."""
    p = make_wgrad_problem([6, 0, 200], 256, 256, pad=2, device="cuda", seed=8)
    a = dict(zip(("a_t", "a_scale", "b_t", "b_scale", "offs"), p.args()))
    return [
        ("a_t", dict(a, a_t=p.a_t.float().to(BF16))),                # bf16
        ("b_t", dict(a, a_t=p.a_t[:, :-128])),                      # fewer blocks than b_t
        ("b_t", dict(a, b_t=p.b_t[:, :-128])),
        ("a_t", dict(a, a_t=p.a_t[:, :-16])),                       # not whole blocks
        ("b_t", dict(a, b_t=p.b_t[:-8])),                           # n not a multiple of 16
        ("a_scale", dict(a, a_scale=p.a_scale[:-1])),
        ("b_scale", dict(a, b_scale=p.b_scale[:, :-1])),
        ("b_scale", dict(a, b_scale=p.b_scale.t().contiguous().t())),  # not contiguous along n
        ("offs", dict(a, offs=p.offs.long())),
        ("offs", dict(a, offs=p.offs.cpu())),                       # another device
    ]


@pytest.mark.parametrize("index", range(10))
def test_op_rejects_bad_input(index):
    name, args = _bad_inputs()[index]
    with pytest.raises((RuntimeError, ValueError), match=rf"\b{name}\b"):
        torch.ops.cute_moe.grouped_mm_fp8_wgrad(**args)
    torch.cuda.synchronize()
    with pytest.raises(ValueError, match=rf"cute_moe\.grouped_mm_fp8_wgrad: {name}: expected"):
        cute_moe.fp8.grouped_mm_wgrad(**args)


def test_bad_offs_traps_on_the_device():
    # offs past the rows the operands hold: a device trap with a message, in a child process
    out = testing.device_trap_output(
        "import torch, cute_moe\n"
        "a = torch.zeros(128, 128 * 3, device='cuda').to(torch.float8_e4m3fn)\n"
        "s = torch.ones(3, 128, device='cuda')\n"
        "sb = torch.ones(3, 1, device='cuda')\n"
        "offs = torch.tensor([100, 900], dtype=torch.int32, device='cuda')\n",
        "torch.ops.cute_moe.grouped_mm_fp8_wgrad(a, s, a, sb, offs)")
    assert "fp8_ragged_k_gemm: invalid offs at group 1" in out, out
