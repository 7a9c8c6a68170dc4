# Random problems of the FP8 ragged-M grouped GEMM (cute_moe.fp8.grouped_mm), quantized from
# random bf16 data by the reference quantizers, and the accuracy check of an output against
# the fp32 reference; shared by the CPU and GPU tests.
from __future__ import annotations

from dataclasses import dataclass

import torch

from cute_moe import testing
from cute_moe.ops.fp8 import reference_grouped_mm_fp8
from cute_moe.reference import fp8 as ref
from cute_moe.reference import grouped_mm_ref, offsets_from_counts
from cute_moe.reference.groups import zero_padding

BF16 = torch.bfloat16
E4M3_NAN = 0x7F  # an e4m3fn NaN, as bits


@dataclass
class Fp8Problem:
    x: torch.Tensor        # e4m3 (m, k)
    x_scale: torch.Tensor  # (m, ceil(k / 128))
    w: torch.Tensor        # e4m3 (E, k, n), k-contiguous: q_t.transpose(-2, -1)
    w_scale: torch.Tensor  # (E, ceil(k / 128), ceil(n / 128)), as-is or a transposed view
    offs: torch.Tensor
    bias: torch.Tensor | None
    row_scale: torch.Tensor | None
    counts: list[int]

    def args(self):
        return self.x, self.x_scale, self.w, self.w_scale, self.offs, self.bias, self.row_scale

    @property
    def used_rows(self) -> int:
        return sum(self.counts)


def make_problem(counts, k, n, *, pad=0, bias=False, row_scale=False, w_scale="as_is",
                 device="cpu", seed=0, poison=True) -> Fp8Problem:
    """Groups of `counts` rows and `pad` padding rows; w_scale "as_is" (the scale of the
    (E, k, n) weight, contiguous) or "t" (the transposed view of the (E, n, k) copy's scale).
    `poison`: the padding rows of x are e4m3 NaNs and their x_scale and row_scale entries
    NaN, so an output row computed from them is not zero."""
    g = torch.Generator(device=device).manual_seed(seed)
    num_groups, m = len(counts), sum(counts) + pad

    def randn(*shape):
        return torch.randn(*shape, generator=g, device=device)

    xq, xs = ref.quantize_1x128(randn(m, k).to(BF16))
    q, s = ref.quantize_128x128((randn(num_groups, k, n) * k ** -0.5).to(BF16))  # y ~ N(0, 1)
    q_t, s_t = q.transpose(-2, -1).contiguous(), s.transpose(-2, -1).contiguous()
    rs = torch.rand(m, generator=g, device=device) if row_scale else None  # router probabilities
    if poison and pad:
        used = sum(counts)
        xq.view(torch.uint8)[used:] = E4M3_NAN
        xs[used:] = float("nan")
        if rs is not None:
            rs[used:] = float("nan")
    return Fp8Problem(xq, xs, q_t.transpose(-2, -1), s if w_scale == "as_is" else s_t.transpose(-2, -1),
                      offsets_from_counts(counts, device=device),
                      randn(num_groups, n).to(BF16) if bias else None, rs, list(counts))


def expected(p: Fp8Problem) -> torch.Tensor:
    """The reference in fp32, before the output's bf16 rounding."""
    return reference_grouped_mm_fp8(*p.args(), out_dtype=torch.float32)


def magnitude(p: Fp8Problem) -> torch.Tensor:
    """|row_scale[r]| * (|deq(x)[r]| @ |deq(w)[e]| + |bias[e]|): the size of the terms each
    output sums, which bounds the error of summing them in another order or precision."""
    x = ref.dequantize_1x128(p.x, p.x_scale).abs()
    w = ref.dequantize_128x128(p.w, p.w_scale).abs()
    bias = p.bias.float().abs() if p.bias is not None else None
    y = grouped_mm_ref(x, w, p.offs, bias, out_dtype=torch.float32)
    if p.row_scale is not None:
        y = y * p.row_scale.abs()[:, None]
    return zero_padding(y, p.offs)


# ||out - ref|| / ||ref|| of the bf16 output against the fp32 reference: bf16 rounding (at
# most 2^-8 relative, about 1.6e-3 in the mean) and the kernel's summation order.
REL_TOL = 4e-3
# Element-wise: |out - ref| <= 2^-7 |ref| (the bf16 rounding, with a factor 2 to spare) plus
# ACC_TOL times the magnitude of the summed terms. The absolute part covers the sums' order and
# the FP8 tensor cores' accumulation inside a 128-long k-block (narrower than fp32; the
# block scales promote it to fp32 once per block): where the terms cancel, that error is
# no longer small against |ref|, and a bound of |ref| alone fails. Measured on an H200 with
# the tensor cores' 128-long partial sums (torch._scaled_mm per k-block, scaled and summed
# in fp32): |y - ref| / magnitude at most 2.7e-5 (k = 2880), 1.3e-5 (k = 8192), 1.6e-4
# (k = 80), against ACC_TOL = 4.9e-4; fp32 relative error ~1e-4, bf16 output ~1.7e-3.
ACC_TOL = 2.0 ** -11


def check_output(out: torch.Tensor, p: Fp8Problem, ref32: torch.Tensor | None = None,
                 name: str = "grouped_mm_fp8") -> None:
    ref32 = expected(p) if ref32 is None else ref32
    m, n = p.x.shape[0], p.w.shape[2]
    assert out.dtype == BF16 and tuple(out.shape) == (m, n) and out.is_contiguous(), \
        (out.dtype, tuple(out.shape), out.stride())
    assert out.device == p.x.device
    assert bool(torch.isfinite(out).all()), f"{name}: non-finite values in the output"
    assert bool((out[p.used_rows:] == 0).all()), f"{name}: padding rows not zero"
    testing.assert_rel_close(out, ref32, name, tol=REL_TOL)
    err = (out.float() - ref32).abs()
    bound = ref32.abs() * 2.0 ** -7 + magnitude(p) * ACC_TOL
    if not bool((err <= bound).all()):
        worst = int(torch.argmax(err - bound))
        r, c = divmod(worst, n)
        raise AssertionError(f"{name}: |out - ref| = {err[r, c].item():.3e} > {bound[r, c].item():.3e} at "
                             f"({r}, {c}): out {out[r, c].item():.6e}, ref {ref32[r, c].item():.6e}")
