# Random problems of the FP8 weight-gradient GEMM (cute_moe.fp8.grouped_mm_wgrad): two
# row-sorted bf16 operands quantized in blocks of each group's rows (transposed, as
# quantize_128x1 lays them out; a by 128 x 1, b by 128 x 128: tile_scales), and the accuracy
# check of a gradient against the fp32 reference on the same quantized inputs; shared by the
# CPU and GPU tests.
from __future__ import annotations

from dataclasses import dataclass

import torch

from cute_moe import fp8, testing
from cute_moe.reference import fp8 as ref
from cute_moe.reference import offsets_from_counts

from fp8_gemm_cases import ACC_TOL, E4M3_NAN

BF16 = torch.bfloat16


@dataclass
class WgradProblem:
    a_t: torch.Tensor     # e4m3 (k, 128 * blocks)
    a_scale: torch.Tensor  # (blocks, k)
    b_t: torch.Tensor     # e4m3 (n, 128 * blocks)
    b_scale: torch.Tensor  # (blocks, ceil(n / 128))
    offs: torch.Tensor
    counts: list[int]
    x: torch.Tensor       # the bf16 operands they were quantized from, (m, k) and (m, n)
    dy: torch.Tensor

    def args(self):
        return self.a_t, self.a_scale, self.b_t, self.b_scale, self.offs


def used_blocks(counts) -> int:
    return sum((c + 127) // 128 for c in counts)


def make_wgrad_problem(counts, k, n, *, pad=0, device="cpu", seed=0, poison=True) -> WgradProblem:
    """Groups of `counts` rows and `pad` padding rows, quantized by cute_moe.fp8.quantize_128x1
    (the CUDA op on a GPU, the reference on the CPU). `poison`: the blocks no group uses are
    e4m3 NaNs with NaN scales, so a gradient that reads them is not finite."""
    g = torch.Generator(device=device).manual_seed(seed)
    m = sum(counts) + pad
    x = torch.randn(m, k, generator=g, device=device).to(BF16)
    dy = torch.randn(m, n, generator=g, device=device).to(BF16)
    offs = offsets_from_counts(counts, device=device)
    a_t, a_s = fp8.quantize_128x1(x, offs)
    b_t, b_s = fp8.quantize_128x1(dy, offs, tile_scales=True)
    if poison:
        used = used_blocks(counts)
        for q, s in ((a_t, a_s), (b_t, b_s)):
            q.view(torch.uint8)[:, 128 * used:] = E4M3_NAN
            s[used:] = float("nan")
    return WgradProblem(a_t, a_s, b_t, b_s, offs, list(counts), x, dy)


def _abs(q: torch.Tensor) -> torch.Tensor:
    return (q.view(torch.uint8) & 0x7F).view(q.dtype)  # e4m3fn: clear the sign bit


def check_wgrad(out: torch.Tensor, p: WgradProblem, name: str = "grouped_mm_fp8_wgrad") -> None:
    """The gradient against the fp32 reference: ||out - ref|| / ||ref|| within 4e-3, and each
    element within 2^-7 of its value plus ACC_TOL of its terms' magnitude (the FP8 tensor
    cores' narrower sums inside a 128-row block, fp8_gemm_cases.py); empty groups exactly 0."""
    ref32 = ref.grouped_mm_wgrad_fp8_t_ref(*p.args())
    e, k, n = len(p.counts), p.a_t.shape[0], p.b_t.shape[0]
    assert out.dtype == BF16 and tuple(out.shape) == (e, k, n) and out.is_contiguous(), \
        (out.dtype, tuple(out.shape), out.stride())
    assert bool(torch.isfinite(out).all()), f"{name}: non-finite values in the gradient"
    empty = torch.tensor(p.counts, device=out.device) == 0
    assert bool((out[empty] == 0).all()), f"{name}: empty groups' gradients not exactly zero"
    if bool((~empty).any()):
        testing.assert_rel_close(out, ref32, name, tol=4e-3)
    magnitude = ref.grouped_mm_wgrad_fp8_t_ref(_abs(p.a_t), p.a_scale, _abs(p.b_t), p.b_scale, p.offs)
    err = (out.float() - ref32).abs()
    bound = ref32.abs() * 2.0 ** -7 + magnitude * ACC_TOL
    if not bool((err <= bound).all()):
        worst = int(torch.argmax(err - bound))
        g, rest = divmod(worst, k * n)
        r, c = divmod(rest, n)
        raise AssertionError(f"{name}: |out - ref| = {err[g, r, c].item():.3e} > {bound[g, r, c].item():.3e} "
                             f"at ({g}, {r}, {c}): out {out[g, r, c].item():.6e}, ref {ref32[g, r, c].item():.6e}")
