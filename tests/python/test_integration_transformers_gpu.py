# GPU tests of experts_implementation="cute_moe" in HF transformers (bf16, the fused SM90
# kernels; cute_moe/integrations/transformers.py) on tiny random GPT-OSS, Qwen3-MoE,
# Mixtral and DeepSeek-V3 models (tests/python/hf_models.py, no downloads):
# - one experts module within bf16 rounding of fp32 "eager" (output, the gradients of
#   the input, the router weights and every expert parameter), through the kernels;
# - the whole model, routing pinned to fp32 "eager"'s: logits and loss within bf16
#   tolerance, gradients as close to fp32 as transformers' own bf16 "grouped_mm";
# - expert-parallel sentinels contributing exactly zero;
# - 5 AdamW steps whose losses track "grouped_mm";
# - no host sync, determinism, one CUDA graph replayed with new routing, no weight copies;
# - torch.compile of the whole model (a graph break at each module's first call; with
#   prepare(), fullgraph=True);
# - fp32 weights on CUDA refused with an error naming "grouped_mm".
# Needs an SM90 GPU and the op library. The CPU twins are in
# test_integration_transformers_cpu.py.
import copy

import pytest
import torch

import cute_moe
import hf_models as hf
from cute_moe import testing
from cute_moe.integrations import transformers as cmt

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.get_device_capability() != (9, 0),
                       reason="the kernels run on SM90 (H100, H200)"),
    pytest.mark.skipif(not cute_moe.library_loaded(), reason="cute_moe op library not loaded "
                       "(pip install --no-build-isolation .)"),
]

F32, BF16 = torch.float32, torch.bfloat16
SIZES = dict(hidden=128, inter=64, experts=8, vocab=128)  # multiples of 8: the kernels' rule
TWO_ROUTES = ["gpt_oss", "qwen3_moe"]  # fused (interleaved) and halves


def _model(arch, **kw):
    return hf.model(arch, **{**SIZES, **kw}).to("cuda")


def _ids(seed=1):
    return hf.inputs(vocab=SIZES["vocab"], seq=64, seed=seed, device="cuda")


def _experts(arch, dtype=BF16):
    """The first experts module of a tiny `arch` model, on the GPU in dtype."""
    return hf.experts_modules(_model(arch))[0].to(dtype)


@pytest.mark.parametrize("arch", hf.ARCHS)
def test_experts_module_within_bf16_rounding_of_fp32_eager(arch):
    ex = hf.experts_modules(_model(arch))[0]
    args = hf.experts_inputs(ex, tokens=512)
    got = hf.experts_grads(cmt.experts_forward, ex, *args, BF16)
    want = hf.experts_grads(hf.eager_experts, ex, *args, F32)
    for name in want:
        testing.assert_rel_close(got[name], want[name], f"{arch}: {name}", tol=hf.BF16_TOL)


@pytest.mark.parametrize("arch", hf.ARCHS)
def test_runs_the_kernels(arch):
    """The plan takes the kernels, and the forward dispatches the fused ops, the up
    projection reading the module's gate/linear layout (its last argument)."""
    ex = _experts(arch)
    hidden, index, weights, _ = hf.experts_inputs(ex)
    with testing.OpLog() as log:
        cmt.experts_forward(ex, hidden.to(BF16), index, weights.to(BF16))
    plan = ex._cute_moe_plan
    assert plan.kernels and plan.route == hf.ROUTES[arch]
    assert "grouped_mm_act" in log.calls and "grouped_mm_scaled" in log.calls, log.calls
    up_args, _ = log.args[log.calls.index("grouped_mm_act")]
    gate_linear = up_args[8] if len(up_args) > 8 else "interleaved"  # dispatch drops defaults
    assert gate_linear == ("halves" if plan.route == "halves" else "interleaved"), up_args
    assert "gather_rows" in log.calls and "gather_sum_rows" in log.calls, log.calls


@pytest.mark.parametrize("arch", hf.ARCHS)
def test_model_bf16_as_close_to_fp32_as_grouped_mm(arch):
    runs = [hf.pinned_steps(_model(arch, seed=seed), _ids(), [("cute_moe", BF16), ("grouped_mm", BF16)])
            for seed in range(3)]
    hf.assert_model_within_noise(runs, arch)


@pytest.mark.parametrize("arch", hf.ARCHS)
def test_expert_parallel_sentinels_contribute_zero(arch):
    ex = hf.experts_modules(_model(arch))[0]
    hidden, index, weights, dy = hf.experts_inputs(ex, tokens=256, sentinels=True)
    m_index, m_weights, sentinel = hf.masked(index, weights, ex.num_experts)
    got = hf.experts_grads(cmt.experts_forward, ex, hidden, index, weights, dy, BF16)
    want = hf.experts_grads(hf.eager_experts, ex, hidden, m_index, m_weights, dy, F32)
    assert torch.count_nonzero(got["out"][0]) == 0
    assert torch.count_nonzero(got["weights"][sentinel]) == 0
    got["weights"], want["weights"] = got["weights"][~sentinel], want["weights"][~sentinel]
    for name in want:
        testing.assert_rel_close(got[name], want[name], f"{arch}: {name}", tol=hf.BF16_TOL)


@pytest.mark.parametrize("arch", hf.ARCHS)
def test_adamw_losses_track_grouped_mm(arch):
    """5 AdamW steps on one batch from the same weights: the losses of "cute_moe" and
    "grouped_mm" (bf16 both, routing free) agree within bf16 noise, and fall."""
    m = _model(arch)
    ids = _ids()
    ours = hf.adamw_losses(m, "cute_moe", BF16, ids)
    theirs = hf.adamw_losses(m, "grouped_mm", BF16, ids)
    assert ours[-1] < ours[0] - 0.3, ours
    for a, b in zip(ours, theirs):
        assert abs(a - b) <= 3e-2 * abs(b), (ours, theirs)


def _module_step(ex, hidden, index, weights, dy):
    out = cmt.experts_forward(ex, hidden, index, weights)
    return out, torch.autograd.grad(out, [hidden, weights] + list(ex.parameters()), dy)


def _module_inputs(ex, seed, tokens=384):
    hidden, index, weights, dy = hf.experts_inputs(ex, tokens=tokens, seed=seed)
    return (hidden.to(BF16).requires_grad_(), index, weights.to(BF16).requires_grad_(),
            dy.to(BF16))


@pytest.mark.parametrize("arch", TWO_ROUTES)
def test_no_host_sync_and_deterministic(arch):
    ex = _experts(arch)
    args = _module_inputs(ex, seed=0)
    first = _module_step(ex, *args)  # warm-up: the plan, lazy initialisations
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        again = _module_step(ex, *args)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert torch.equal(first[0], again[0])
    for a, b in zip(first[1], again[1]):
        assert torch.equal(a, b)


@pytest.mark.parametrize("arch", TWO_ROUTES)
def test_cuda_graph_replays_with_new_routing(arch):
    """Forward + backward of an experts module captured once and replayed with new inputs
    and routing: every output equals an eager run on them."""
    ex = _experts(arch)
    static = _module_inputs(ex, seed=10)
    graph, (static_out, static_grads) = testing.capture_graph(lambda: _module_step(ex, *static),
                                                              warmup=3)
    for seed in (11, 12):
        new = _module_inputs(ex, seed=seed)
        assert not torch.equal(new[1], static[1])
        with torch.no_grad():
            for s, n in zip(static, new):
                s.copy_(n)
        graph.replay()
        out, grads = _module_step(ex, *new)
        torch.cuda.synchronize()
        assert torch.equal(static_out, out)
        for a, b in zip(static_grads, grads):
            assert torch.equal(a, b)


@pytest.mark.parametrize("arch", hf.ARCHS)
def test_forward_makes_no_copy_of_a_weight(arch):
    ex = _experts(arch)
    hidden, index, weights, _ = hf.experts_inputs(ex, tokens=40)
    mode = hf.WeightCopies([p for p in ex.parameters() if p.dim() == 3])
    with mode:
        cmt.experts_forward(ex, hidden.to(BF16), index, weights.to(BF16))
    assert mode.copies == []


@pytest.mark.parametrize("arch", TWO_ROUTES)
def test_compile_whole_model(arch):
    """torch.compile (inductor) of the whole bf16 model, forward and backward: with a graph
    break at each experts module's first call (where its plan is made), and with
    fullgraph=True after prepare(). Inductor rounds the model's fused elementwise ops
    otherwise than eager, so the bar is the fp32 model (routing pinned to its): logits
    and loss within bf16 tolerance (or as close as the eager bf16 model), finite
    gradients. (aot_eager, eager's bits: test_integration_transformers_cpu.py with the
    op library.)"""
    m = _model(arch)
    steps = hf.pinned_steps(m, _ids(), [("cute_moe", BF16)])
    ref, eager = steps["eager"], steps["cute_moe", BF16]
    bars = [max(hf.BF16_TOL, hf.noise_bar(testing.rel_error(eager[i], ref[i]))) for i in (0, 1)]
    for fullgraph in (False, True):
        torch._dynamo.reset()
        b = copy.deepcopy(m).to(BF16)
        b.set_experts_implementation("cute_moe")
        if fullgraph:
            cmt.prepare(b)
        with hf.pinned_routing(b, steps["routing"]):
            got = hf.step(torch.compile(b, fullgraph=fullgraph), _ids())
        what = f"{arch} fullgraph={fullgraph}"
        testing.assert_rel_close(got[0], ref[0], f"{what}: logits", tol=bars[0])
        testing.assert_rel_close(got[1], ref[1], f"{what}: loss", tol=bars[1])
        for name, g in got[2].items():
            assert torch.isfinite(g).all(), (what, name)
        assert all(x._cute_moe_plan.kernels for x in hf.experts_modules(b))


def test_fp32_weights_on_cuda_are_refused_with_a_working_alternative():
    m = _model("mixtral")  # fp32
    m.set_experts_implementation("cute_moe")
    with pytest.raises(cmt.UnsupportedExpertsError,
                       match=r"torch.float32.*bfloat16.*experts_implementation='eager'"):
        m(input_ids=_ids())
    m.set_experts_implementation("eager")  # the one named works
    m(input_ids=_ids())
