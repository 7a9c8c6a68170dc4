# CPU tests of cute_moe.integrations.torchtitan (the torchtitan release pinned in
# requirements-torchtitan.txt) on torchtitan's own experts modules and tiny models built
# from configs (tests/python/torchtitan_models.py, no downloads):
# - conversion keeps everything torchtitan sees: the same Parameter objects under the same
#   names, state-dict keys, checkpoints loading both ways; isinstance of torchtitan's
#   class; the "cute_moe" model converter in torchtitan's build path; idempotent;
# - fp32, cute_moe's references: output and every parameter and input gradient equal
#   torchtitan's own experts (its exact-dtype for-loop) for GroupedExperts (Qwen3-MoE,
#   DeepSeek-V3, Llama 4) and GPT-OSS's experts (clamp crossed), with empty and skewed
#   experts and expert-parallel padding rows;
# - bf16, the package's bf16 functions (the code the GPU runs, minus the kernels): within
#   bf16 rounding of fp32;
# - with the op library: torch.compile(fullgraph=True) of a converted module, eager's bits;
# - FSDP2 (gloo, one and two processes): converted after fully_shard, DTensor placements
#   of parameters and gradients unchanged, results equal to torchtitan's experts;
# - expert parallelism (gloo, EP = 2): converted before parallelization, cute_moe's reorder
#   of the received rows gives torchtitan's results, whose own padded permutation (run on
#   the CPU through its index kernel's CPU path) unconverted modules keep;
# - errors: experts classes with a forward of their own, quantized parameter types,
#   models without experts, unsupported devices.
# torchtitan's MoE router counts tokens with torch.histc on int64, which has no CPU
# kernel, so whole models run in the GPU twin only (test_integration_torchtitan_gpu.py).
import copy
import os
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist

pytest.importorskip("torchtitan", reason="torchtitan is not installed "
                    "(pip install --no-deps -r requirements-torchtitan.txt)")
import torchtitan_models as tm  # noqa: F401  (before torchtitan's model packages)
import cute_moe
from cute_moe import testing
from cute_moe.integrations import torchtitan as ctt
from torchtitan.models.gpt_oss.model.moe import GptOssGroupedExperts
from torchtitan.models.moe.moe import GroupedExperts

F32, BF16 = torch.float32, torch.bfloat16
ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
FAMILIES = ["llama", "gpt_oss"]


def _experts(family, *, dim=32, inter=16, experts=6, std=0.1, seed=0, dtype=F32):
    """A torchtitan experts module with random parameters, on its exact-dtype path (the
    for-loop; its grouped_mm path pads through a Triton kernel, GPU only)."""
    torch.manual_seed(seed)
    if family == "llama":
        m = GroupedExperts(dim, inter, experts, use_grouped_mm=False)
    else:
        m = GptOssGroupedExperts(dim, inter, experts, swiglu_limit=7.0, use_grouped_mm=False)
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(0, std)
    return m.to(dtype)


def _inputs(module, counts, *, padding=0, seed=1, scale=1.0, dtype=F32):
    """Rows sorted by expert (counts (E,) int64, as torchtitan's histc of expert ids gives them), then
    `padding` zero rows (what expert-parallel permutation appends), and an output grad."""
    g = torch.Generator().manual_seed(seed)
    dim = module.w1.shape[2] if hasattr(module, "w1") else module.mlp1_weight.shape[2]
    rows = int(sum(counts))
    x = torch.cat([torch.randn(rows, dim, generator=g) * scale, torch.zeros(padding, dim)])
    dy = torch.randn(rows + padding, dim, generator=g)
    return (x.to(dtype).requires_grad_(), torch.tensor(counts, dtype=torch.int64),
            dy.to(dtype))


def _run(module, x, counts, dy):
    """Output and the gradients of x and every parameter, by name."""
    x = x.detach().clone().requires_grad_()
    module.zero_grad(set_to_none=True)
    y = module(x, counts)
    y.backward(dy.to(y.dtype))
    out = {"out": y.detach().float(), "x": x.grad.float()}
    out.update({n: p.grad.float() for n, p in module.named_parameters()})
    return out


COUNTS = {"balanced": [4, 4, 4, 4, 4, 4], "skewed": [17, 1, 0, 3, 0, 2],
          "empty": [0, 0, 9, 0, 0, 0], "none": [0, 0, 0, 0, 0, 0]}


# --- conversion keeps what torchtitan sees --------------------------------------------------

@pytest.mark.parametrize("family", FAMILIES)
def test_convert_keeps_parameters_names_and_state_dict(family):
    m = _experts(family)
    params = dict(m.named_parameters())
    sd = {k: v.clone() for k, v in m.state_dict().items()}
    base = type(m)
    assert ctt.convert(m) is m
    assert isinstance(m, base) and type(m) is not base and ctt.is_converted(m)
    assert type(m).__name__ == "CuteMoE" + base.__name__
    after = dict(m.named_parameters())
    assert list(after) == list(params) and all(after[n] is params[n] for n in params)
    assert list(m.state_dict()) == list(sd)
    for k, v in m.state_dict().items():
        assert torch.equal(v, sd[k])
    ctt.convert(m)  # idempotent
    assert type(m).__mro__[1:].count(base) == 1 and dict(m.named_parameters()) == after


@pytest.mark.parametrize("name", ["qwen3", "gpt_oss", "deepseek_v3", "llama4"])
def test_model_converter_in_torchtitans_build_path(name, tmp_path):
    """The train spec's model built on the meta device with model.converters = ["cute_moe"]
    (as Trainer does): every experts module converted, state-dict keys those of the
    unconverted model; a checkpoint of either loads into the other."""
    from torchtitan.protocols.train_spec import get_train_spec
    spec = get_train_spec(name)
    flavor = next(f for f in spec.model_args if "debug" in f and _has_moe(spec.model_args[f]))
    job = tm.job_config(name)

    def build(converters):
        job.model.converters = converters
        args = copy.deepcopy(spec.model_args[flavor])
        args.update_from_config(job)  # as Trainer does
        with torch.device("meta"):
            model = spec.model_cls(args)
        from torchtitan.protocols.model_converter import build_model_converters
        build_model_converters(job, tm.parallel_dims(job)).convert(model)
        return model

    ours, theirs = build(["cute_moe"]), build([])
    assert len(ctt.experts_modules(ours)) > 0
    assert all(ctt.is_converted(m) for m in ctt.experts_modules(ours))
    assert not any(ctt.is_converted(m) for m in theirs.modules())
    assert list(ours.state_dict()) == list(theirs.state_dict())
    assert [n for n, _ in ours.named_parameters()] == [n for n, _ in theirs.named_parameters()]


def _has_moe(args):
    return getattr(args, "moe_enabled", True) and getattr(args, "moe_args", None) is not None


def test_checkpoint_round_trip_on_a_built_model(tmp_path):
    """A tiny Qwen3-MoE built the way Trainer builds it, with and without the converter,
    materialized and initialized: torch.save of one loads strictly into the other."""
    args, job = tm.qwen3_args(grouped_mm=False), tm.job_config("qwen3")
    dims = tm.parallel_dims(job)
    theirs = tm.build_model("qwen3", args, job, dims, "cpu", cute=False)
    ours = tm.build_model("qwen3", args, job, dims, "cpu", cute=True)
    path = tmp_path / "ckpt.pt"
    torch.save(theirs.state_dict(), path)
    ours.load_state_dict(torch.load(path), strict=True)
    for (k, a), (k2, b) in zip(ours.state_dict().items(), theirs.state_dict().items()):
        assert k == k2 and torch.equal(a, b), k
    torch.save(ours.state_dict(), path)
    theirs.load_state_dict(torch.load(path), strict=True)


# --- fp32: equal to torchtitan's experts ------------------------------------------------

@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("routing", list(COUNTS))
@pytest.mark.parametrize("padding", [0, 5])
def test_matches_torchtitan_experts_fp32(family, routing, padding):
    """Output, input gradient and every parameter gradient against torchtitan's own
    forward (fp32). GPT-OSS with pre-activations of std ~8, so its clamps at 7 are
    crossed. Padding rows (expert parallelism's) come out zero."""
    theirs = _experts(family, std=0.5 if family == "gpt_oss" else 0.1)
    ours = ctt.convert(copy.deepcopy(theirs))
    args = _inputs(theirs, COUNTS[routing], padding=padding, scale=3.0)
    got, want = _run(ours, *args), _run(theirs, *args)
    assert list(got) == list(want)
    for name in want:
        testing.assert_rel_close(got[name], want[name], f"{family} {routing}: {name}",
                                 tol=testing.tolerance(F32))
    if padding:
        assert torch.count_nonzero(got["out"][-padding:]) == 0


def test_gpt_oss_clamp_is_crossed():
    m = _experts("gpt_oss", std=0.5)
    x = _inputs(m, COUNTS["balanced"], scale=3.0)[0]
    pre = torch.einsum("rd,egd->reg", x.detach(), m.mlp1_weight.detach())
    assert pre.abs().max() > 7.0


def test_gpt_oss_limit_and_alpha_are_torchtitans():
    m = _experts("gpt_oss", std=0.5)
    m.swiglu_limit = 2.5
    theirs = copy.deepcopy(m)
    ours = ctt.convert(m)
    args = _inputs(m, COUNTS["skewed"], scale=3.0)
    testing.assert_rel_close(_run(ours, *args)["out"], _run(theirs, *args)["out"], "limit 2.5",
                             tol=testing.tolerance(F32))
    import torchtitan.models.gpt_oss.model.moe as gm
    import inspect
    assert ctt._gpt_oss_alpha() == inspect.signature(gm.swiglu).parameters["alpha"].default


# --- bf16: the package's bf16 functions -----------------------------------------------------

@pytest.mark.parametrize("family", FAMILIES)
def test_bf16_within_rounding_of_fp32(family):
    """bf16 parameters and input (the route the GPU takes): within bf16 rounding of fp32
    torchtitan, and at least as close as torchtitan's own bf16 experts."""
    ref = _experts(family, std=0.3 if family == "gpt_oss" else 0.1)
    theirs_bf16 = copy.deepcopy(ref).to(BF16)
    ours = ctt.convert(copy.deepcopy(ref).to(BF16))
    x, counts, dy = _inputs(ref, COUNTS["skewed"], scale=2.0)
    want = _run(ref, x, counts, dy)
    got = _run(ours, x.to(BF16), counts, dy.to(BF16))
    theirs = _run(theirs_bf16, x.to(BF16), counts, dy.to(BF16))
    for name in want:
        err, base = testing.rel_error(got[name], want[name]), testing.rel_error(theirs[name], want[name])
        assert err <= max(testing.tolerance(BF16), 2 * base), (family, name, err, base)


def test_gate_up_pair_casts_into_one_buffer():
    """fp32 w1, w3 (one GPU, no FSDP) are cast into the two halves of one bf16 buffer, w3's
    above w1's (where the fused forward reads both in place); bf16 ones are passed as they are.
    Each gets its gradient in its own dtype."""
    w1, w3 = torch.randn(3, 4, 8, requires_grad=True), torch.randn(3, 4, 8, requires_grad=True)
    g, lin = ctt._gate_up_pair(w1, w3, BF16)
    assert g.shape == (3, 8, 4) and g.dtype == BF16 and g.stride(1) == 1
    assert lin.stride() == g.stride()
    assert lin.data_ptr() - g.data_ptr() == w1.numel() * 2  # the next half of one buffer
    assert torch.equal(g, w1.detach().to(BF16).transpose(-2, -1))
    assert torch.equal(lin, w3.detach().to(BF16).transpose(-2, -1))
    dg, dl = torch.randn(3, 8, 4, dtype=BF16), torch.randn(3, 8, 4, dtype=BF16)
    torch.autograd.backward([g, lin], [dg, dl])
    assert w1.grad.dtype == F32 and torch.equal(w1.grad, dg.float().transpose(-2, -1))
    assert torch.equal(w3.grad, dl.float().transpose(-2, -1))
    b1, b3 = w1.detach().to(BF16), w3.detach().to(BF16)
    g, lin = ctt._gate_up_pair(b1, b3, BF16)
    assert g.data_ptr() == b1.data_ptr() and lin.data_ptr() == b3.data_ptr()


@pytest.mark.skipif(not cute_moe.library_loaded(), reason="needs the op library (its CPU kernels "
                    "and fake kernels; the references read offs on the host)")
@pytest.mark.parametrize("family", FAMILIES)
def test_compile_fullgraph_gives_eager_bits(family):
    """torch.compile(fullgraph=True, backend="aot_eager") of a converted bf16 experts
    module, forward and backward: no graph break, eager's bits."""
    ours = ctt.convert(_experts(family, dtype=BF16))
    args = _inputs(ours, COUNTS["skewed"], padding=3, dtype=BF16)
    want = _run(ours, *args)
    torch._dynamo.reset()
    compiled = torch.compile(ours, fullgraph=True, backend="aot_eager")
    got = _run_fn(compiled, ours, *args)
    for name in want:
        assert torch.equal(got[name], want[name]), (family, name)


def _run_fn(fn, module, x, counts, dy):
    x = x.detach().clone().requires_grad_()
    module.zero_grad(set_to_none=True)
    y = fn(x, counts)
    y.backward(dy.to(y.dtype))
    out = {"out": y.detach().float(), "x": x.grad.float()}
    out.update({n: p.grad.float() for n, p in module.named_parameters()})
    return out


# --- FSDP2 (gloo) ----------------------------------------------------------------------

def _fsdp_worker(rank, world, port, family, errors):
    try:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        from torch.distributed.tensor import DTensor
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=world)
        mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("fsdp",))
        theirs = _experts(family, std=0.3)
        ours = copy.deepcopy(theirs)
        for m in (theirs, ours):
            fully_shard(m, mesh=mesh)
        placements = {n: p.placements for n, p in ours.named_parameters()}
        ctt.convert(ours)  # after fully_shard: FSDP's class and hooks kept
        assert {n: p.placements for n, p in ours.named_parameters()} == placements
        args = _inputs(theirs, COUNTS["skewed"], seed=1 + rank, scale=2.0)
        got, want = _run(ours, *args), _run(theirs, *args)
        for n, p in ours.named_parameters():
            assert isinstance(p, DTensor) and isinstance(p.grad, DTensor), n
            assert p.grad.placements == placements[n], n
        for name in want:
            testing.assert_rel_close(got[name], want[name], f"rank {rank} {family}: {name}",
                                     tol=testing.tolerance(F32))
        dist.destroy_process_group()
    except BaseException as exc:  # reported by the parent
        errors.put(f"rank {rank}: {type(exc).__name__}: {exc}")
        raise


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("world", [1, 2])
def test_fsdp2_sharded_parameters_and_gradients(family, world):
    """fully_shard over `world` gloo processes, then convert: parameters and gradients
    stay DTensors with FSDP's placements, and every rank's output and (reduce-scattered)
    gradients equal torchtitan's experts sharded the same way."""
    testing.run_workers(_fsdp_worker, world, family, timeout=240)


# --- expert parallelism (gloo) -------------------------------------------------------------

EP_COUNTS = [[17, 1, 0, 3, 0, 2], [0, 5, 2, 0, 9, 1]]  # per rank: empty chunks, one-rank experts


def _ep_run(module, x, counts, dy):
    """Output and the gradients of x and this rank's parameter shards, by name."""
    out = _run(module, x, counts, dy)
    return {n: v.to_local() if hasattr(v, "to_local") else v for n, v in out.items()}


def _ep_worker(rank, world, port, family, errors):
    try:
        import functools

        import torchtitan.models.moe.utils as moe_utils
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.parallel import parallelize_module
        from torchtitan.distributed.expert_parallel import ExpertParallel
        from cute_moe.integrations import torchtitan_expert_parallel as cep
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=world)
        mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("ep",))
        # torchtitan's own permutation on the CPU: its index kernel's CPU path
        moe_utils.generate_permute_indices = functools.partial(
            moe_utils.generate_permute_indices, use_cpu=True)
        theirs = _experts(family, std=0.3)
        ours = ctt.convert(copy.deepcopy(theirs))  # before parallelizing: cute_moe's reorder
        assert cep.installed()
        styles = {"theirs": ExpertParallel(), "ours": ExpertParallel()}
        parallelize_module(theirs, mesh, styles["theirs"])
        parallelize_module(ours, mesh, styles["ours"])
        args = _inputs(theirs, EP_COUNTS[rank], seed=1 + rank, scale=2.0)
        got, want = _ep_run(ours, *args), _ep_run(theirs, *args)
        # each took its own route: torchtitan's padded permutation, cute_moe's gathers
        assert styles["theirs"].permuted_indices is not None
        assert styles["ours"].permuted_indices is None and hasattr(styles["ours"], cep._STATE)
        assert set(got) == set(want)
        for name in want:
            testing.assert_rel_close(got[name], want[name], f"rank {rank} {family}: {name}",
                                     tol=testing.tolerance(F32))
        dist.barrier()  # every collective done before the group goes (gloo aborts otherwise)
        dist.destroy_process_group()
    except BaseException as exc:  # reported by the parent
        errors.put(f"rank {rank}: {type(exc).__name__}: {exc}")
        raise


@pytest.mark.parametrize("family", FAMILIES)
def test_expert_parallel_reorder_matches_torchtitans(family):
    """EP = 2 over two gloo processes, the experts converted before parallelization: every
    rank's output and input gradient, and its shards' gradients, equal torchtitan's experts
    under torchtitan's own dispatch (its padded permutation), which unconverted modules
    keep."""
    testing.run_workers(_ep_worker, 2, family, timeout=240)


# --- errors -----------------------------------------------------------------------------

def test_experts_with_a_forward_of_their_own_are_refused():
    class MyExperts(GroupedExperts):
        def forward(self, x, num_tokens_per_expert):
            return x

    m = torch.nn.Sequential(MyExperts(16, 8, 2, use_grouped_mm=True))
    with pytest.raises(ctt.UnsupportedExpertsError, match=r"MyExperts.*forward of its own"):
        ctt.convert(m)


def test_model_without_experts_is_refused():
    with pytest.raises(ValueError, match=r"no torchtitan experts module"):
        ctt.convert(torch.nn.Sequential(torch.nn.Linear(4, 4)))


def test_weights_of_a_tensor_subclass_are_refused():
    """e.g. a quantized training recipe's weight wrapper: the kernels would bypass it."""
    from torch.testing._internal.two_tensor import TwoTensor
    m = ctt.convert(_experts("llama"))
    m.w2 = torch.nn.Parameter(TwoTensor(m.w2.detach().clone(), m.w2.detach().clone()))
    x, counts, _ = _inputs(m, COUNTS["balanced"])
    with pytest.raises(ctt.UnsupportedExpertsError, match=r"TwoTensor.*plain"):
        m(x, counts)


def test_unsupported_device_is_refused():
    m = ctt.convert(_experts("gpt_oss")).to("meta")
    x = torch.empty(4, 32, device="meta")
    with pytest.raises(ctt.UnsupportedExpertsError,
                       match=r"on meta.*SM90.*torchtitan's own experts"):
        m(x, torch.tensor([4, 0, 0, 0, 0, 0], device="meta"))


def test_importing_the_integration_registers_the_converter_only():
    code = ("import sys, cute_moe, cute_moe.integrations; "
            "assert 'torchtitan' not in sys.modules; "
            "import cute_moe.integrations.torchtitan as t; "
            "from torchtitan.protocols import model_converter as mc; "
            "assert mc._registry_model_converter_cls['cute_moe'] is t.CuteMoEConverter; "
            "t.register(); "
            "assert 'datasets' not in sys.modules, 'datasets imported'")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [os.path.join(ROOT, "python")] + [p for p in sys.path if p]))
    subprocess.run([sys.executable, "-c", code], check=True, env=env)
