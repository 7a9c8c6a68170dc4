# CPU tests of experts_implementation="cute_moe" in HF transformers (the release pinned in
# requirements-dev.txt; cute_moe/integrations/transformers.py). Tiny random GPT-OSS,
# Qwen3-MoE, Mixtral and DeepSeek-V3 models (tests/python/hf_models.py, no downloads):
# - fp32, cute_moe's references: logits, loss and every parameter gradient equal
#   transformers' "eager" to fp32 rounding; the activations it maps and those it refuses;
#   expert-parallel sentinels contributing exactly zero; the parameters read in place
#   (no weight copies, state dicts and checkpoints unchanged); registration;
# - bf16, the package's bf16 functions (the op library's CPU kernels or, without it, the
#   references under the same autograd: the code the GPU runs, minus the kernels): one
#   experts module within bf16 rounding of fp32 "eager", the whole model as close to the
#   fp32 model as transformers' own bf16 "grouped_mm", AdamW losses tracking it;
# - with the op library: torch.compile(fullgraph=True) of the whole model;
# - examples/finetune_transformers_gpt_oss.py, a CPU smoke run.
# The GPU twins are in test_integration_transformers_gpu.py.
import copy
import os
import subprocess
import sys
import types

import pytest
import torch
from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS, ExpertsInterface

import cute_moe
import hf_models as hf
from cute_moe import testing
from cute_moe.integrations import transformers as cmt

F32, BF16 = torch.float32, torch.bfloat16
BF16_TOL = hf.BF16_TOL
ROOT = os.path.join(os.path.dirname(__file__), "..", "..")


def _plans(m):
    return [x._cute_moe_plan for x in hf.experts_modules(m)]


# --- registration -----------------------------------------------------------------------

def test_importing_cute_moe_does_not_import_transformers():
    code = ("import sys, cute_moe, cute_moe.integrations, cute_moe.nn; "
            "assert 'transformers' not in sys.modules, 'transformers imported'; "
            "import cute_moe.integrations.transformers as t; "
            "from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS as F; "
            "assert F['cute_moe'] is t.experts_forward")
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
    subprocess.run([sys.executable, "-c", code], check=True, env=env)


def test_register_is_idempotent_and_selectable():
    cmt.register()
    cmt.register()
    assert ALL_EXPERTS_FUNCTIONS["cute_moe"] is cmt.experts_forward
    assert ExpertsInterface().get_interface("cute_moe", None) is cmt.experts_forward
    assert list(ALL_EXPERTS_FUNCTIONS).count("cute_moe") == 1
    m = hf.model("mixtral")
    m.set_experts_implementation("cute_moe")
    assert m.get_experts_implementation()[""] == "cute_moe"
    # the config argument, as from_pretrained(..., experts_implementation=...) sets it
    cfg = hf.config("qwen3_moe", experts_implementation="cute_moe")
    m2 = hf._MODELS[type(cfg)](cfg)
    assert m2.config._experts_implementation == "cute_moe"
    m2(input_ids=hf.inputs())
    assert [p.route for p in _plans(m2)] == ["halves", "halves"]


# --- fp32: equal to transformers' eager ---------------------------------------------------

@pytest.mark.parametrize("arch", hf.ARCHS)
def test_matches_eager_fp32(arch):
    """Logits, loss and the gradient of every parameter (routers, attention, embeddings
    included) against "eager", routing pinned to eager's. Pre-activations of std 3, so
    GPT-OSS's clamps at 7 are crossed."""
    m = hf.model(arch, expert_scale=3.0)
    ids = hf.inputs()
    steps = hf.pinned_steps(m, ids, [("cute_moe", F32)])
    hf.assert_steps_close(steps["cute_moe", F32], steps["eager"], testing.tolerance(F32), arch)


@pytest.mark.parametrize("arch", hf.ARCHS)
def test_plan_route_and_layout(arch):
    m = hf.model(arch)
    m.set_experts_implementation("cute_moe")
    m(input_ids=hf.inputs())
    for plan, ex in zip(_plans(m), hf.experts_modules(m)):
        assert plan.route == hf.ROUTES[arch] and plan.kernels is False
        assert plan.out_in == (not ex.is_transposed) and plan.bias == ex.has_bias
        if arch == "gpt_oss":
            assert (plan.activation, plan.alpha, plan.limit) == ("swiglu_oai", ex.alpha, ex.limit)
        else:
            assert (plan.activation, plan.limit) == ("swiglu", None)


@pytest.mark.parametrize("hidden_act,ours", [("silu", "swiglu"), ("swish", "swiglu"),
                                             ("gelu_pytorch_tanh", "geglu"),
                                             ("gelu_new", "geglu"), ("gelu_fast", "geglu")])
def test_served_activations(hidden_act, ours):
    m = hf.model("qwen3_moe", hidden_act=hidden_act)
    ids = hf.inputs()
    steps = hf.pinned_steps(m, ids, [("cute_moe", F32)])
    hf.assert_steps_close(steps["cute_moe", F32], steps["eager"], testing.tolerance(F32),
                        hidden_act)
    b = copy.deepcopy(m)
    b.set_experts_implementation("cute_moe")
    b(input_ids=ids)
    assert {p.activation for p in _plans(b)} == {ours}


@pytest.mark.parametrize("hidden_act", ["gelu", "relu", "quick_gelu", "tanh"])
def test_unserved_activation_raises_naming_a_working_implementation(hidden_act):
    m = hf.model("mixtral", hidden_act=hidden_act)
    m.set_experts_implementation("cute_moe")
    with pytest.raises(cmt.UnsupportedExpertsError,
                       match=rf"hidden_act='{hidden_act}'.*experts_implementation='grouped_mm'"):
        m(input_ids=hf.inputs())
    m.set_experts_implementation("grouped_mm")  # the one named works
    m(input_ids=hf.inputs())


def _nemotron_experts(act: str):
    from transformers import NemotronHConfig
    from transformers.models.nemotron_h.modeling_nemotron_h import NemotronHExperts
    cfg = NemotronHConfig(hidden_size=32, n_routed_experts=4, moe_intermediate_size=16,
                          num_experts_per_tok=2, mlp_hidden_act=act)
    torch.manual_seed(0)
    ex = NemotronHExperts(cfg)
    for p in ex.parameters():
        torch.nn.init.normal_(p, std=0.3)
    return ex


def test_non_gated_relu2_runs_fused_srelu():
    """NemotronH's experts (has_gate=False: up_proj (E, I, H), relu2) take the fused
    route with "srelu" on transposed views."""
    ex = _nemotron_experts("relu2")
    args = hf.experts_inputs(ex)
    got = hf.experts_grads(cmt.experts_forward, ex, *args, F32)
    want = hf.experts_grads(hf.eager_experts, ex, *args, F32)
    for name in want:
        testing.assert_rel_close(got[name], want[name], name, F32)
    plan = cmt._plan(ex)
    assert (plan.route, plan.activation, plan.up, plan.out_in) == ("fused", "srelu", "up_proj",
                                                                  True)
    with pytest.raises(cmt.UnsupportedExpertsError, match="non-gated activation.*relu2"):
        cmt._plan(_nemotron_experts("silu"))


def _with_class(module, name, attrs):
    module.__class__ = type(name, (type(module),), attrs)
    return module


def _own_gate(self, gate_up):
    return gate_up[..., : gate_up.shape[-1] // 2]


def test_unknown_gate_and_post_norm_raise():
    for arch in ("mixtral", "gpt_oss"):
        ex = _with_class(hf.experts_modules(hf.model(arch))[0], "OwnGate",
                         {"_apply_gate": _own_gate})
        with pytest.raises(cmt.UnsupportedExpertsError,
                           match="OwnGate: its gate _own_gate is its own.*'grouped_mm'"):
            cmt._plan(ex)
    ex = hf.experts_modules(hf.model("qwen3_moe"))[0]
    ex.has_post_expert_norm = True
    with pytest.raises(cmt.UnsupportedExpertsError, match="norm after the down projection"):
        cmt._plan(ex)
    ex = hf.experts_modules(hf.model("qwen3_moe"))[0]
    ex.is_concatenated = False  # the default gate reads halves whatever the flag says
    with pytest.raises(cmt.UnsupportedExpertsError, match="is_concatenated=False"):
        cmt._plan(ex)


def test_device_and_dtype_errors(monkeypatch):
    """What a CUDA machine would hear (faked here): not SM90, fp32 weights, no library;
    and a device cute_moe has no path for."""
    ex = hf.experts_modules(hf.model("gpt_oss"))[0]
    cuda = torch.device("cuda", 0)
    monkeypatch.setattr(cmt._library, "library_loaded", lambda: True)
    props = {"major": 8, "minor": 0, "name": "NVIDIA A100"}
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda dev: types.SimpleNamespace(**props))
    w = types.SimpleNamespace(device=cuda, dtype=BF16)
    with pytest.raises(cmt.UnsupportedExpertsError,
                       match=r"NVIDIA A100 \(sm_80\).*SM90.*'grouped_mm'"):
        cmt._uses_kernels(ex, w)
    props.update(major=9, minor=0, name="NVIDIA H100")
    assert cmt._uses_kernels(ex, w) is True
    with pytest.raises(cmt.UnsupportedExpertsError, match=r"torch.float32.*bfloat16.*'eager'"):
        cmt._uses_kernels(ex, types.SimpleNamespace(device=cuda, dtype=F32))
    monkeypatch.setattr(cmt._library, "library_loaded", lambda: False)
    with pytest.raises(cmt.UnsupportedExpertsError, match="op library is not loaded.*'grouped_mm'"):
        cmt._uses_kernels(ex, w)
    ex.to("meta")
    with pytest.raises(cmt.UnsupportedExpertsError, match="meta.*'grouped_mm'"):
        cmt.experts_forward(ex, *(t.to("meta") for t in hf.experts_inputs(ex)[:3]))


# --- expert-parallel sentinels ------------------------------------------------------------

@pytest.mark.parametrize("dtype", [F32, BF16])
@pytest.mark.parametrize("arch", hf.ARCHS)
def test_expert_parallel_sentinels_contribute_zero(arch, dtype):
    """Ids >= num_experts (here E and E + 3, with nonzero weights; token 0 has only
    sentinels) add nothing: the same result as "eager" on the routing with those choices
    masked (expert 0, weight 0), a zero output for token 0 and zero gradients for the
    sentinels' weights, exactly."""
    ex = hf.experts_modules(hf.model(arch))[0]
    hidden, index, weights, dy = hf.experts_inputs(ex, sentinels=True)
    m_index, m_weights, sentinel = hf.masked(index, weights, ex.num_experts)
    got = hf.experts_grads(cmt.experts_forward, ex, hidden, index, weights, dy, dtype)
    want = hf.experts_grads(hf.eager_experts, ex, hidden, m_index, m_weights, dy, F32)
    assert torch.count_nonzero(got["out"][0]) == 0
    assert torch.count_nonzero(got["weights"][sentinel]) == 0
    got["weights"], want["weights"] = got["weights"][~sentinel], want["weights"][~sentinel]
    tol = testing.tolerance(F32) if dtype == F32 else BF16_TOL
    for name in want:
        testing.assert_rel_close(got[name], want[name], name, tol=tol)


# --- the parameters are read in place ------------------------------------------------------

@pytest.mark.parametrize("arch", hf.ARCHS)
def test_forward_makes_no_copy_of_a_weight(arch):
    ex = hf.experts_modules(hf.model(arch, hidden=48, inter=40))[0]
    hidden, index, weights, _ = hf.experts_inputs(ex, tokens=24)
    mode = hf.WeightCopies([p for p in ex.parameters() if p.dim() == 3])
    with mode:
        cmt.experts_forward(ex, hidden, index, weights)
    assert mode.copies == []


@pytest.mark.parametrize("arch", ["gpt_oss", "deepseek_v3"])
def test_state_dict_and_checkpoints_unchanged(arch, tmp_path):
    """The same parameters, keys and tensors after cute_moe has run (its plan is no
    parameter or buffer); a checkpoint saved there loads with
    from_pretrained(..., experts_implementation="cute_moe") and computes the same."""
    m = hf.model(arch)
    before = m.state_dict()
    params = dict(m.named_parameters())
    m.set_experts_implementation("cute_moe")
    ids = hf.inputs()
    logits, loss, _ = hf.step(m, ids)
    after = m.state_dict()
    assert list(after) == list(before)
    assert all(after[k] is before[k] or after[k].data_ptr() == before[k].data_ptr() for k in after)
    assert dict(m.named_parameters()).keys() == params.keys()
    assert all(p is params[n] for n, p in m.named_parameters())
    m.save_pretrained(tmp_path)
    loaded = type(m).from_pretrained(tmp_path, experts_implementation="cute_moe", dtype=F32)
    assert loaded.config._experts_implementation == "cute_moe"
    assert list(loaded.state_dict()) == list(before)
    with torch.no_grad():  # (a reloaded DeepSeek-V3 differs in the last bits, with "eager" too)
        testing.assert_rel_close(loaded(input_ids=ids).logits, m(input_ids=ids).logits,
                                 "reloaded logits", F32)


# --- bf16: the package's bf16 functions (the GPU's code path without the kernels) ----------

@pytest.mark.parametrize("arch", hf.ARCHS)
def test_experts_module_bf16_within_rounding_of_fp32_eager(arch):
    """One experts module in bf16 against fp32 "eager" on the same inputs: output and the
    gradients of the input, the router weights and every expert parameter."""
    ex = hf.experts_modules(hf.model(arch, hidden=64, inter=32, experts=8))[0]
    args = hf.experts_inputs(ex, tokens=128)
    got = hf.experts_grads(cmt.experts_forward, ex, *args, BF16)
    want = hf.experts_grads(hf.eager_experts, ex, *args, F32)
    for name in want:
        testing.assert_rel_close(got[name], want[name], name, tol=BF16_TOL)


@pytest.mark.parametrize("arch", hf.ARCHS)
def test_model_bf16_as_close_to_fp32_as_grouped_mm(arch):
    """The whole bf16 model, routing pinned to fp32 "eager"'s, against it and against
    transformers' own bf16 "grouped_mm" (hf_models.assert_model_within_noise says why
    that is the bar for the gradients). Five model seeds: at DeepSeek-V3's tiny config one
    seed of three put either implementation 2-3x further off than the other (router
    gradients 37% vs 18% at seed 0, 6% vs 10% at seed 2), while its experts module gives
    the same bits through either gate/linear layout."""
    runs = [hf.pinned_steps(hf.model(arch, hidden=64, inter=32, experts=8, vocab=128, seed=seed),
                            hf.inputs(vocab=128, seq=32), [("cute_moe", BF16), ("grouped_mm", BF16)])
            for seed in range(5)]
    hf.assert_model_within_noise(runs, arch)


def test_adamw_losses_track_grouped_mm_bf16():
    m = hf.model("gpt_oss", hidden=64, inter=32, experts=8, vocab=128)
    ids = hf.inputs(vocab=128, seq=32)
    ours = hf.adamw_losses(m, "cute_moe", BF16, ids)
    theirs = hf.adamw_losses(m, "grouped_mm", BF16, ids)
    assert ours[-1] < ours[0] - 0.3  # it learns
    for a, b in zip(ours, theirs):
        assert abs(a - b) <= 3e-2 * abs(b), (ours, theirs)


@pytest.mark.skipif(not cute_moe.library_loaded(), reason="the op library's ops are what "
                    "torch.compile traces (the library-less fallback reads offs on the host)")
@pytest.mark.parametrize("arch", ["gpt_oss", "qwen3_moe"])
def test_compile_whole_model(arch):
    """torch.compile of the whole bf16 model, forward and backward: with a graph break
    where a module makes its plan (first call), and with fullgraph=True once prepare()
    has made them; both compute what eager does."""
    m = hf.model(arch, hidden=64, inter=32, experts=8, vocab=128).to(BF16)
    m.set_experts_implementation("cute_moe")
    ids = hf.inputs(vocab=128, seq=32)
    want = hf.step(copy.deepcopy(m), ids)
    for fullgraph in (False, True):
        torch._dynamo.reset()
        b = copy.deepcopy(m)
        if fullgraph:
            cmt.prepare(b)
        got = hf.step(torch.compile(b, fullgraph=fullgraph, backend="aot_eager"), ids)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
        for name in want[2]:
            assert torch.equal(got[2][name], want[2][name]), name


def test_finetune_example_cpu_smoke(tmp_path):
    """examples/finetune_transformers_gpt_oss.py with --device cpu --tiny: both runs, the
    CSV of their losses (equal at fp32 rounding), the PNG where matplotlib is installed."""
    script = os.path.join(ROOT, "examples", "finetune_transformers_gpt_oss.py")
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
    run = subprocess.run([sys.executable, script, "--device", "cpu", "--tiny", "--steps", "4",
                          "--out", str(tmp_path)], env=env, capture_output=True, text=True,
                         check=True)
    assert "cute_moe: final loss" in run.stdout and "grouped_mm: final loss" in run.stdout
    with open(tmp_path / "losses.csv") as f:
        rows = [line.strip().split(",") for line in f]
    assert rows[0] == ["step", "loss_cute_moe", "loss_grouped_mm"] and len(rows) == 5
    for _, ours, theirs in rows[1:]:
        assert abs(float(ours) - float(theirs)) <= 1e-4 * abs(float(theirs))
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert "matplotlib is not installed" in run.stdout
    else:
        assert (tmp_path / "loss_curve.png").stat().st_size > 0


def test_finetune_example_fp8_weight_grads_cpu_smoke(tmp_path):
    """The example's --fp8-weight-grads on the CPU (bf16 weights, the FP8 references): the
    cute_moe_fp8 run trains with all six GEMMs in FP8 and stays near bf16's losses."""
    script = os.path.join(ROOT, "examples", "finetune_transformers_gpt_oss.py")
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
    run = subprocess.run([sys.executable, script, "--device", "cpu", "--tiny", "--dtype", "bf16", "--steps",
                          "3", "--implementations", "cute_moe,cute_moe_fp8", "--fp8-weight-grads", "--out",
                          str(tmp_path)], env=env, capture_output=True, text=True, check=True)
    assert "cute_moe_fp8: final loss" in run.stdout
    with open(tmp_path / "losses.csv") as f:
        rows = [line.strip().split(",") for line in f]
    assert rows[0] == ["step", "loss_cute_moe", "loss_cute_moe_fp8"] and len(rows) == 4
    for _, bf16, fp8 in rows[1:]:
        assert float(bf16) != float(fp8) and abs(float(bf16) - float(fp8)) <= 2e-2 * abs(float(bf16))
