# experts_implementation="cute_moe_fp8" in HF transformers (cute_moe/integrations/transformers.py):
# the expert GEMMs in FP8 (cute_moe.fp8.expert_ffn) for GPT-OSS's experts. On the CPU (the FP8
# references) and, on an SM90 GPU with the op library, through the FP8 kernels:
# - one GPT-OSS experts module: the output and every gradient (input, router weights, each
#   expert parameter) within FP8 error of fp32 "eager", and not the bf16 result; sentinels
#   contribute zero;
# - AdamW steps of the whole model that learn and track "grouped_mm";
# - the modules it does not serve (halves, (E, out, in) storage, fp32) raise naming "cute_moe".
import pytest
import torch
from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

import cute_moe
import hf_models as hf
from cute_moe import testing
from cute_moe.integrations import transformers as cmt

F32, BF16 = torch.float32, torch.bfloat16
_SM90 = (torch.cuda.is_available() and cute_moe.library_loaded()
         and torch.cuda.get_device_capability() == (9, 0))
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not _SM90, reason="the FP8 kernels need an SM90 GPU and the compiled library"))]
SIZES = dict(hidden=128, inter=64, experts=8, vocab=128)  # multiples of 16: 16-byte e4m3 rows
# FP8 against fp32: the e4m3 roundings of up to three chained GEMM operands (cute_moe.fp8.
# expert_ffn's docstring: 5-9% on random data); bound 0.12.
FP8_TOL = 0.12


def test_registered_beside_cute_moe():
    cmt.register()
    assert ALL_EXPERTS_FUNCTIONS["cute_moe_fp8"] is cmt.experts_forward_fp8
    assert ALL_EXPERTS_FUNCTIONS["cute_moe"] is cmt.experts_forward


@pytest.mark.parametrize("device", DEVICES)
def test_gpt_oss_experts_module_within_fp8_error_of_fp32(device):
    ex = hf.experts_modules(hf.model("gpt_oss", **SIZES).to(device))[0]
    hidden, index, weights, dy = hf.experts_inputs(ex, tokens=384, sentinels=True)
    m_index, m_weights, sentinel = hf.masked(index, weights, ex.num_experts)
    got = hf.experts_grads(cmt.experts_forward_fp8, ex, hidden, index, weights, dy, BF16)
    bf16 = hf.experts_grads(cmt.experts_forward, ex, hidden, index, weights, dy, BF16)
    want = hf.experts_grads(hf.eager_experts, ex, hidden, m_index, m_weights, dy, F32)
    assert torch.count_nonzero(got["out"][0]) == 0  # token 0: sentinels only
    assert torch.count_nonzero(got["weights"][sentinel]) == 0
    got["weights"], want["weights"] = got["weights"][~sentinel], want["weights"][~sentinel]
    for name in want:
        testing.assert_rel_close(got[name], want[name], f"fp8 {name}", tol=FP8_TOL)
    err = float((got["out"].float() - bf16["out"].float()).norm() / bf16["out"].float().norm())
    assert err > 1e-3, "the FP8 result equals the bf16 one: FP8 did not run"


def test_plan_follows_the_implementation():
    m = hf.model("gpt_oss", **SIZES).to(BF16)
    ids = hf.inputs(vocab=SIZES["vocab"], seq=32)
    for name, precision in (("cute_moe_fp8", "fp8"), ("cute_moe", "bf16"), ("cute_moe_fp8", "fp8")):
        m.set_experts_implementation(name)
        m(input_ids=ids)
        assert [x._cute_moe_plan.precision for x in hf.experts_modules(m)] == [precision] * 2
    m.set_experts_implementation("cute_moe_fp8")
    cmt.prepare(m)  # the plans of the name each module runs
    assert all(x._cute_moe_plan.precision == "fp8" for x in hf.experts_modules(m))


@pytest.mark.parametrize("device", DEVICES)
def test_adamw_losses_learn_and_track_grouped_mm(device):
    m = hf.model("gpt_oss", **SIZES).to(device)
    ids = hf.inputs(vocab=SIZES["vocab"], seq=32, device=device)
    ours = hf.adamw_losses(m, "cute_moe_fp8", BF16, ids)
    theirs = hf.adamw_losses(m, "grouped_mm", BF16, ids) if device == "cuda" else \
        hf.adamw_losses(m, "cute_moe", BF16, ids)
    assert ours[-1] < ours[0] - 0.3  # it learns
    for a, b in zip(ours, theirs):
        assert abs(a - b) <= 5e-2 * abs(b), (ours, theirs)


def test_what_it_does_not_serve_names_cute_moe():
    for arch in ("qwen3_moe", "mixtral"):  # [gate | up] halves, (E, out, in) storage
        ex = hf.experts_modules(hf.model(arch, **SIZES).to(BF16))[0]
        with pytest.raises(cmt.UnsupportedExpertsError,
                           match=r"'cute_moe_fp8'.*halves are not the FP8 block's layout.*"
                                 r"experts_implementation='cute_moe'"):
            cmt._plan(ex, "fp8")
        assert cmt._plan(ex).precision == "bf16"  # "cute_moe" serves it
    ex = hf.experts_modules(hf.model("gpt_oss", **SIZES))[0]  # fp32
    with pytest.raises(cmt.UnsupportedExpertsError,
                       match=r"'cute_moe_fp8'.*float32; the FP8 expert block takes bfloat16.*"
                             r"'cute_moe'"):
        cmt._plan(ex, "fp8")
    ex = hf.experts_modules(hf.model("gpt_oss", hidden=128, inter=40, experts=4).to(BF16))[0]
    with pytest.raises(cmt.UnsupportedExpertsError, match=r"multiples of 16, got 128 and 40"):
        cmt._plan(ex, "fp8")



@pytest.mark.parametrize("device", DEVICES)
def test_trainer_callback_reuses_casts_with_the_same_training(device):
    """Fp8WeightCastsCallback driven by transformers' CallbackHandler in the order HF's
    Trainer (5.24, Trainer._inner_training_loop) fires its events with gradient accumulation:
    on_step_begin at a step's first micro-batch, the micro-batches' forwards and backwards,
    on_pre_optimizer_step, the AdamW step (fused, which moves no version counter), on_step_end;
    3 micro-batches a step, 3 steps. Each experts module's two weights are cast once per step
    (one pass each), the other micro-batches reuse them, and the trained parameters are those
    of the same loop without the callback, bit for bit. (The Trainer itself, and its
    TrainingArguments, need accelerate, which the tests do not install.)"""
    import copy
    from types import SimpleNamespace
    from transformers.trainer_callback import CallbackHandler, TrainerControl, TrainerState

    g = torch.Generator().manual_seed(3)
    batches = [ids.to(device) for ids in torch.randint(0, SIZES["vocab"], (9, 2, 32), generator=g)]
    start = hf.model("gpt_oss", **SIZES).to(BF16)
    steps, micro = 3, 3

    def train(callbacks):
        m = copy.deepcopy(start).to(device)
        m.set_experts_implementation("cute_moe_fp8")
        opt = torch.optim.AdamW(m.parameters(), lr=1e-3, fused=True)
        handler = CallbackHandler(callbacks, m, None, opt, None)
        # (TrainingArguments needs accelerate too: the callback reads no argument)
        args, state, control = SimpleNamespace(), TrainerState(), TrainerControl()
        for step in range(steps):
            handler.on_step_begin(args, state, control)
            for ids in batches[step * micro:(step + 1) * micro]:
                (m(input_ids=ids, labels=ids).loss / micro).backward()
            handler.on_pre_optimizer_step(args, state, control)
            opt.step()
            m.zero_grad()
            handler.on_step_end(args, state, control)
        handler.on_train_end(args, state, control)
        return {n: p.detach().clone() for n, p in m.named_parameters()}

    want = train([])
    callback = cmt.Fp8WeightCastsCallback()
    got = train([callback])
    modules = len(hf.experts_modules(start))
    assert callback.casts == steps * modules * 2
    # per step and weight: its backward, and each later micro-batch's forward and backward
    assert callback.reuses == steps * modules * 2 * (1 + 2 * (micro - 1))
    assert want.keys() == got.keys()
    for name in want:
        assert torch.equal(got[name], want[name]), name
