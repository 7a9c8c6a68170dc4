# GPU tests of cute_moe.integrations.torchtitan (bf16, the fused SM90 kernels) against
# torchtitan's default experts (its torch._grouped_mm path, with its token-group padding):
# - one experts module (GroupedExperts, GPT-OSS's) within bf16 rounding of fp32, as close
#   as torchtitan's own bf16 experts; expert-parallel padding rows zero;
# - the kernels run ([gate | up] halves for GroupedExperts), no host sync, deterministic,
#   GPT-OSS's weights read without a copy;
# - tiny Qwen3-MoE and GPT-OSS models built and trained the way torchtitan's Trainer does
#   (tests/python/torchtitan_models.py: train spec, model converter "cute_moe", AdamW with
#   MoE load balancing, AMP, gradient clipping), same weights and batches: losses within
#   bf16 noise of the default experts, and falling; also with torchtitan's per-block
#   torch.compile (which leaves the experts eager);
# - a converted experts module under torch.compile(fullgraph=True), forward and backward.
# Needs an SM90 GPU and the op library. The CPU twins are in
# test_integration_torchtitan_cpu.py. With two GPUs: expert parallelism (EP = 2, NCCL) of one
# experts module against torchtitan's; whole models under FSDP2 + EP=2: scripts/torchtitan_2gpu.sh.
import copy

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import cute_moe
pytest.importorskip("torchtitan", reason="torchtitan is not installed "
                    "(pip install --no-deps -r requirements-torchtitan.txt)")
import torchtitan_models as tm
from cute_moe import testing
from cute_moe.integrations import torchtitan as ctt
from torchtitan.models.gpt_oss.model.moe import GptOssGroupedExperts
from torchtitan.models.moe.moe import GroupedExperts

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.get_device_capability() != (9, 0),
                       reason="the kernels run on SM90 (H100, H200)"),
    pytest.mark.skipif(not cute_moe.library_loaded(), reason="cute_moe op library not loaded "
                       "(pip install --no-build-isolation .)"),
]

F32, BF16 = torch.float32, torch.bfloat16
FAMILIES = ["llama", "gpt_oss"]
DIM, INTER, EXPERTS = 256, 128, 8


def _experts(family, dtype=F32, std=None, grouped_mm=True):
    torch.manual_seed(0)
    if family == "llama":
        m = GroupedExperts(DIM, INTER, EXPERTS, use_grouped_mm=grouped_mm)
    else:
        m = GptOssGroupedExperts(DIM, INTER, EXPERTS, swiglu_limit=7.0, use_grouped_mm=grouped_mm)
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(0, std or (0.1 if family == "gpt_oss" else 0.05))
    return m.to("cuda", dtype)


def _inputs(counts, padding=0, seed=1, scale=2.0):
    g = torch.Generator().manual_seed(seed)
    rows = int(sum(counts))
    x = torch.cat([torch.randn(rows, DIM, generator=g) * scale, torch.zeros(padding, DIM)])
    dy = torch.randn(rows + padding, DIM, generator=g)
    return x.cuda(), torch.tensor(counts, dtype=torch.int64, device="cuda"), dy.cuda()


def _run(module, x, counts, dy, dtype):
    x = x.detach().to(dtype).requires_grad_()
    module.zero_grad(set_to_none=True)
    y = module(x, counts)
    y.backward(dy.to(y.dtype))
    out = {"out": y.detach().float(), "x": x.grad.float()}
    out.update({n: p.grad.float() for n, p in module.named_parameters()})
    return out


COUNTS = [130, 0, 77, 512, 1, 64, 200, 33]


@pytest.mark.parametrize("family", FAMILIES)
def test_experts_within_bf16_rounding_and_as_close_as_torchtitans(family):
    ref = _experts(family, grouped_mm=False)  # fp32, torchtitan's exact-dtype loop
    theirs = copy.deepcopy(ref).to(BF16)
    theirs.use_grouped_mm = True  # torchtitan's default bf16 route
    ours = ctt.convert(copy.deepcopy(ref).to(BF16))
    args = _inputs(COUNTS)
    want = _run(ref, *args, F32)
    got, base = _run(ours, *args, BF16), _run(theirs, *args, BF16)
    for name in want:
        err, berr = testing.rel_error(got[name], want[name]), testing.rel_error(base[name], want[name])
        assert err <= max(testing.tolerance(BF16), 1.5 * berr), (family, name, err, berr)


@pytest.mark.parametrize("family", FAMILIES)
def test_fp32_parameters_as_on_one_gpu(family):
    """Single-GPU torchtitan keeps fp32 parameters (AMP) and its experts cast them to bf16
    per call; so do ours: same bar, fp32 gradients."""
    ref = _experts(family, grouped_mm=False)
    theirs = copy.deepcopy(ref)
    theirs.use_grouped_mm = True
    ours = ctt.convert(copy.deepcopy(ref))
    args = _inputs(COUNTS, seed=3)
    want = _run(ref, *args, F32)
    got, base = _run(ours, *args, BF16), _run(theirs, *args, BF16)
    for n, p in ours.named_parameters():
        assert p.grad.dtype == F32, n
    for name in want:
        err, berr = testing.rel_error(got[name], want[name]), testing.rel_error(base[name], want[name])
        assert err <= max(testing.tolerance(BF16), 1.5 * berr), (family, name, err, berr)


@pytest.mark.parametrize("family", FAMILIES)
def test_expert_parallel_padding_rows_are_zero(family):
    ours = ctt.convert(_experts(family, BF16))
    x, counts, dy = _inputs(COUNTS, padding=24)
    out = _run(ours, x, counts, dy, BF16)
    assert torch.count_nonzero(out["out"][-24:]) == 0
    assert torch.count_nonzero(out["x"][-24:]) == 0


@pytest.mark.parametrize("family", FAMILIES)
def test_runs_the_kernels(family):
    ours = ctt.convert(_experts(family, BF16))
    x, counts, dy = _inputs(COUNTS)
    with testing.OpLog() as log:
        ours(x.to(BF16), counts)
    # the router scores are applied outside the experts: a plain down projection (grouped_mm's
    # kernel, called as grouped_mm_scaled: no autograd layer)
    assert "grouped_mm_act" in log.calls and "grouped_mm_scaled" in log.calls, log.calls
    up_args, _ = log.args[log.calls.index("grouped_mm_act")]
    gate_linear = up_args[8] if len(up_args) > 8 else "interleaved"
    assert gate_linear == ("halves" if family == "llama" else "interleaved"), up_args
    assert up_args[5] == ("swiglu" if family == "llama" else "swiglu_oai"), up_args


@pytest.mark.parametrize("family", FAMILIES)
def test_no_host_sync_and_deterministic(family):
    ours = ctt.convert(_experts(family, BF16))
    args = _inputs(COUNTS)
    first = _run(ours, *args, BF16)  # warm-up
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        again = _run(ours, *args, BF16)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    for name in first:
        assert torch.equal(first[name], again[name]), name


class _Copies(TorchDispatchMode):
    """Records ops that read a whole weight into a new tensor (copy_, clone, cat, _to_copy)."""

    def __init__(self, weights):
        super().__init__()
        self.ptrs = {w.untyped_storage().data_ptr() for w in weights}
        self.copies = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.__name__
        if any(k in name for k in ("copy", "clone", "cat", "_to_copy")):
            for a in list(args) + list((kwargs or {}).values()):
                for t in (a if isinstance(a, (list, tuple)) else [a]):
                    if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() in self.ptrs:
                        self.copies.append(name)
        return func(*args, **(kwargs or {}))


def test_weights_read_in_place():
    """bf16 parameters (FSDP2's param_dtype) are read where they are: GPT-OSS's mlp1, and
    w1, w3 as the pair of halves; fp32 ones (one GPU) get the per-call bf16 cast torchtitan's
    own experts make (two copies, into one buffer), nothing else."""
    g = ctt.convert(_experts("gpt_oss", BF16))
    x, counts, _ = _inputs(COUNTS)
    with _Copies([g.mlp1_weight, g.mlp2_weight]) as mode:
        g(x.to(BF16), counts)
    assert mode.copies == []
    m = ctt.convert(_experts("llama", BF16))
    with _Copies([m.w1, m.w3, m.w2]) as mode:
        m(x.to(BF16), counts)
    assert mode.copies == [], mode.copies
    m = ctt.convert(_experts("llama", F32))
    with _Copies([m.w1, m.w3]) as mode:
        m(x, counts)
    assert mode.copies == ["copy_.default"] * 2, mode.copies  # the casts into one buffer


# --- whole models, torchtitan's way ----------------------------------------------------

MODEL_SIZES = dict(dim=256, inter=128, experts=8, layers=2, vocab=512, heads=4, head_dim=64)


def _losses(name, steps=8, compile_model=False, seq=128, batch=4):
    """Per-step losses of torchtitan's default experts and of cute_moe's, from the same
    weights, on one batch repeated (so that the loss falls)."""
    args = tm.ARGS[name](**MODEL_SIZES)
    if name == "qwen3":
        args.moe_args.top_k = 2
    job = tm.job_config(name, seq=seq, batch=batch, lr=3e-3, steps=steps)
    if compile_model:
        job.compile.enable, job.compile.components = True, ["model"]
    dims = tm.parallel_dims(job)
    data = tm.batches(1, batch=batch, seq=seq, vocab=MODEL_SIZES["vocab"], device="cuda") * steps
    out = {}
    theirs = tm.build_model(name, args, job, dims, "cuda", cute=False)
    sd = {k: v.detach().clone() for k, v in theirs.state_dict().items()}
    for cute in (False, True):
        model = theirs if not cute else tm.build_model(name, args, job, dims, "cuda", cute=True,
                                                       state_dict=sd)
        assert all(ctt.is_converted(m) == cute for m in tm.experts_of(model))
        step = tm.TrainStep(name, model, args, job, dims)
        out[cute] = torch.stack([step.step(*b) for b in data]).tolist()
        del model, step
    return out[True], out[False]


@pytest.mark.parametrize("name", ["qwen3", "gpt_oss"])
def test_training_losses_track_torchtitans_experts(name):
    ours, theirs = _losses(name)
    assert ours[-1] < ours[0] - 0.2, ours
    for a, b in zip(ours, theirs):
        assert abs(a - b) <= 3e-2 * abs(b), (ours, theirs)


def test_training_under_torchtitans_compile():
    """job.compile.enable with components ["model"]: torchtitan compiles every submodule of
    each MoE block with fullgraph=True but the experts (run eager, between its FSDP
    hooks); the converted experts sit in that model unchanged."""
    ours, theirs = _losses("qwen3", steps=5, compile_model=True)
    for a, b in zip(ours, theirs):
        assert abs(a - b) <= 3e-2 * abs(b), (ours, theirs)


@pytest.mark.parametrize("family", FAMILIES)
def test_converted_experts_compile_fullgraph(family):
    """torch.compile(fullgraph=True) of a converted experts module, forward and backward
    (fp32 parameters, as on one GPU): no graph break, the eager results."""
    ours = ctt.convert(_experts(family))
    args = _inputs(COUNTS, seed=5)
    want = _run(ours, *args, BF16)
    torch._dynamo.reset()
    compiled = torch.compile(ours, fullgraph=True)
    x, counts, dy = args
    xb = x.to(BF16).requires_grad_()
    ours.zero_grad(set_to_none=True)
    y = compiled(xb, counts)
    y.backward(dy.to(y.dtype))
    got = {"out": y.detach().float(), "x": xb.grad.float()}
    got.update({n: p.grad.float() for n, p in ours.named_parameters()})
    for name in want:
        testing.assert_rel_close(got[name], want[name], f"{family} compiled: {name}", tol=1e-2)


# --- expert parallelism on two GPUs (NCCL) -----------------------------------------------

EP_COUNTS = [[130, 0, 77, 512, 1, 64, 200, 33], [0, 90, 3, 0, 256, 17, 0, 8]]


def _ep_worker(rank, world, port, family, errors):
    try:
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.parallel import parallelize_module
        from torchtitan.distributed.expert_parallel import ExpertParallel
        torch.cuda.set_device(rank)
        dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=world)
        mesh = init_device_mesh("cuda", (world,), mesh_dim_names=("ep",))
        ref = _experts(family, grouped_mm=False)  # fp32, torchtitan's loop, its own dispatch
        theirs = copy.deepcopy(ref).to(BF16)
        theirs.use_grouped_mm = True
        ours = ctt.convert(copy.deepcopy(ref).to(BF16))  # before parallelizing: our reorder
        styles = [ExpertParallel() for _ in range(3)]
        for m, style in zip((ref, theirs, ours), styles):
            parallelize_module(m, mesh, style)
        args = _inputs(EP_COUNTS[rank], seed=1 + rank)

        def run(m, dtype):
            out = _run(m, *args, dtype)
            return {n: v.to_local() if hasattr(v, "to_local") else v for n, v in out.items()}

        want, base, got = run(ref, F32), run(theirs, BF16), run(ours, BF16)
        assert styles[2].permuted_indices is None and styles[1].permuted_indices is not None
        for name in want:
            err, berr = testing.rel_error(got[name], want[name]), testing.rel_error(base[name], want[name])
            assert err <= max(testing.tolerance(BF16), 1.5 * berr), (rank, family, name, err, berr)
        again = run(ours, BF16)  # deterministic, all-to-alls included
        assert all(torch.equal(again[n], got[n]) for n in got)
        dist.barrier()
        dist.destroy_process_group()
    except BaseException as exc:  # reported by the parent
        errors.put(f"rank {rank}: {type(exc).__name__}: {exc}")
        raise


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs (FSDP2 + EP runs: "
                    "scripts/torchtitan_2gpu.sh)")
@pytest.mark.parametrize("family", FAMILIES)
def test_expert_parallel_on_two_gpus(family):
    """EP = 2 over NCCL, converted before parallelization (cute_moe's reorder, unpadded):
    every rank's output, input gradient and expert shards' gradients within bf16 rounding
    of the fp32 experts, as close as torchtitan's bf16 experts under its own dispatch;
    bitwise repeatable."""
    testing.run_workers(_ep_worker, 2, family)
