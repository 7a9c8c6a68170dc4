# Test-data helpers shared by the tests and the benchmark: ragged group sizes for the
# routing patterns an MoE layer sees, random grouped-GEMM problems, the relative error
# every test reports, and the one tolerance table all tests use.
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from .reference.groups import offsets_from_counts

__all__ = ["assert_empty_batch", "device_trap_output", "run_workers", "ROUTINGS", "TOLERANCE", "tolerance",
           "rel_error", "assert_rel_close", "group_sizes", "Problem", "random_problem", "ExpertFFN",
           "random_expert_ffn"]

# Largest accepted ||out - ref|| / ||ref|| against an fp32 (or finer) ground truth,
# keyed by the dtype the output is rounded to.
TOLERANCE = {torch.bfloat16: 1e-2, torch.float16: 2e-3, torch.float32: 1e-5,
             torch.float64: 1e-12}

# balanced: near-equal; skewed: Zipf-like with a few empty groups; empty: about half of
# the groups empty; single: every row in one group.
ROUTINGS = ("balanced", "skewed", "empty", "single")


def tolerance(dtype: torch.dtype) -> float:
    return TOLERANCE[dtype]


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in float64; ||out|| when ref is all zeros."""
    out, ref = out.detach().double(), ref.detach().double()
    if out.shape != ref.shape:
        raise ValueError(f"shape mismatch: out {tuple(out.shape)} vs ref {tuple(ref.shape)}")
    den = ref.norm().item()
    num = (out - ref).norm().item()
    return num / den if den > 0 else out.norm().item()


def assert_rel_close(out: torch.Tensor, ref: torch.Tensor, name: str,
                     dtype: torch.dtype | None = None, tol: float | None = None) -> None:
    """rel_error(out, ref) <= tol, by default the tolerance of dtype (out's dtype)."""
    if tol is None:
        tol = tolerance(dtype or out.dtype)
    err = rel_error(out, ref)
    if not err <= tol:  # also catches NaN
        raise AssertionError(f"{name}: relative error {err:.3e} > {tol:.0e}")


def _rounded(weights: torch.Tensor, total: int) -> list[int]:
    """Integer sizes proportional to `weights` summing to `total` (largest remainder)."""
    share = weights / weights.sum() * total
    sizes = share.floor().long()
    rest = total - int(sizes.sum())
    if rest:
        sizes[torch.argsort(share - sizes, descending=True)[:rest]] += 1
    return sizes.tolist()


def group_sizes(total: int, num_groups: int, routing: str = "balanced", *,
                generator: torch.Generator | None = None,
                max_size: int | None = None) -> list[int]:
    """Rows per group, summing to `total`, for a routing pattern of ROUTINGS.
    `max_size` caps every group (e.g. at the token count under top-k routing)."""
    g = generator
    if routing == "balanced":
        weights = torch.ones(num_groups, dtype=torch.float64)
    elif routing == "skewed":
        rank = torch.randperm(num_groups, generator=g).double()
        weights = (rank + 1) ** -1.2
        weights[rank >= max(1, num_groups - num_groups // 8)] = 0.0
    elif routing == "empty":
        weights = torch.rand(num_groups, generator=g, dtype=torch.float64) + 0.5
        weights[torch.randperm(num_groups, generator=g)[: num_groups // 2]] = 0.0
    elif routing == "single":
        weights = torch.zeros(num_groups, dtype=torch.float64)
        weights[torch.randint(num_groups, (1,), generator=g)] = 1.0
    else:
        raise ValueError(f"routing: expected one of {ROUTINGS}, got {routing!r}")
    sizes = _rounded(weights, total)
    if max_size is not None:
        if max_size * int((weights > 0).sum()) < total:
            raise ValueError(f"max_size={max_size} cannot hold {total} rows")
        while max(sizes) > max_size:
            excess = sum(max(0, s - max_size) for s in sizes)
            sizes = [min(s, max_size) for s in sizes]
            room = torch.tensor([max_size - s if w > 0 else 0 for s, w in zip(sizes, weights)],
                                dtype=torch.float64)
            sizes = [s + a for s, a in zip(sizes, _rounded(room, excess))]
    return sizes


@dataclass
class Problem:
    x: torch.Tensor       # (M, K)
    weight: torch.Tensor  # leaf: (E, K, N) for layout "kn", (E, N, K) for layout "nk"
    offs: torch.Tensor    # (E,) int32
    bias: torch.Tensor | None  # (E, N)
    sizes: list[int]
    layout: str

    @property
    def w(self) -> torch.Tensor:
        """The (E, K, N) operand: `weight`, or its transposed view for layout "nk"."""
        return self.weight if self.layout == "kn" else self.weight.transpose(-2, -1)

    @property
    def used_rows(self) -> int:
        return sum(self.sizes)


def random_problem(m: int, k: int, n: int, num_groups: int, routing: str = "balanced", *,
                   pad: int = 0, layout: str = "kn", bias: bool = False,
                   dtype: torch.dtype = torch.bfloat16, device="cpu",
                   generator: torch.Generator | None = None,
                   requires_grad: bool = False) -> Problem:
    """A grouped GEMM problem with m rows of which the last `pad` are padding (random
    values the op must ignore). Values are scaled so that outputs are O(1)."""
    if layout not in ("kn", "nk"):
        raise ValueError(f"layout: expected 'kn' or 'nk', got {layout!r}")
    g = generator
    sizes = group_sizes(m - pad, num_groups, routing, generator=g)
    x = torch.randn(m, k, generator=g)
    shape = (num_groups, k, n) if layout == "kn" else (num_groups, n, k)
    weight = torch.randn(*shape, generator=g) / k ** 0.5
    b = torch.randn(num_groups, n, generator=g) if bias else None

    def prep(t):
        if t is None:
            return None
        return t.to(device=device, dtype=dtype).requires_grad_(requires_grad)

    return Problem(prep(x), prep(weight), offsets_from_counts(sizes, device=device), prep(b),
                   sizes, layout)


@dataclass
class ExpertFFN:
    x: torch.Tensor          # (M, H)
    weight_up: torch.Tensor  # leaf: (E, H, 2I) for layout "kn", (E, 2I, H) for "nk"
    b_up: torch.Tensor | None    # (E, 2I)
    weight_down: torch.Tensor    # leaf: (E, I, H) for layout "kn", (E, H, I) for "nk"
    b_down: torch.Tensor | None  # (E, H)
    offs: torch.Tensor       # (E,) int32
    sizes: list[int]
    layout: str

    @property
    def w_up(self) -> torch.Tensor:
        """The (E, H, 2I) operand: weight_up or its transposed view."""
        return self.weight_up if self.layout == "kn" else self.weight_up.transpose(-2, -1)

    @property
    def w_down(self) -> torch.Tensor:
        """The (E, I, H) operand: weight_down or its transposed view."""
        return self.weight_down if self.layout == "kn" else self.weight_down.transpose(-2, -1)

    @property
    def leaves(self) -> list[torch.Tensor]:
        """x, weight_up, b_up, weight_down, b_down, without the absent biases."""
        return [t for t in (self.x, self.weight_up, self.b_up, self.weight_down, self.b_down)
                if t is not None]

    @property
    def used_rows(self) -> int:
        return sum(self.sizes)


def random_expert_ffn(m: int, hidden: int, inter: int, num_groups: int,
                      routing: str = "balanced", *, pad: int = 0, layout: str = "kn",
                      bias: bool = True, scale: float = 1.0, dtype: torch.dtype = torch.bfloat16,
                      device="cpu", generator: torch.Generator | None = None,
                      requires_grad: bool = False) -> ExpertFFN:
    """An MoE expert FFN problem (up projection to 2I interleaved gate/linear columns,
    down projection back to H) with m rows of which the last `pad` are padding. The
    pre-activations have standard deviation about `scale` (bias included), so a scale of
    a few puts many of them past a SwiGLU limit of 7."""
    if layout not in ("kn", "nk"):
        raise ValueError(f"layout: expected 'kn' or 'nk', got {layout!r}")
    g = generator
    sizes = group_sizes(m - pad, num_groups, routing, generator=g)
    e, two_i = num_groups, 2 * inter
    b_scale = scale / 2 ** 0.5 if bias else 0.0
    x = torch.randn(m, hidden, generator=g)
    up_shape = (e, hidden, two_i) if layout == "kn" else (e, two_i, hidden)
    w_up = torch.randn(*up_shape, generator=g) * ((scale ** 2 - b_scale ** 2) / hidden) ** 0.5
    b_up = torch.randn(e, two_i, generator=g) * b_scale if bias else None
    down_shape = (e, inter, hidden) if layout == "kn" else (e, hidden, inter)
    w_down = torch.randn(*down_shape, generator=g) / inter ** 0.5
    b_down = torch.randn(e, hidden, generator=g) if bias else None

    def prep(t):
        if t is None:
            return None
        return t.to(device=device, dtype=dtype).requires_grad_(requires_grad)

    return ExpertFFN(prep(x), prep(w_up), prep(b_up), prep(w_down), prep(b_down),
                     offsets_from_counts(sizes, device=device), sizes, layout)


def capture_graph(fn, warmup: int = 2):
    """(graph, outputs): fn() run `warmup` times on a side stream (lazy initialisations
    happen outside the capture), then captured once in a CUDA graph whose replay() reruns
    it on the same tensors, refreshing `outputs`."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = fn()
    return graph, outputs


def device_trap_output(setup: str, call: str) -> str:
    """The output of a call that a device-side check must stop: `setup` and then `call` run in a
    child Python process (with torch and cute_moe imported), because the check prints its
    message and traps, which leaves the CUDA context unusable for good. Asserts that the call
    raised (the child exits with 3) instead of returning; the caller checks the message."""
    script = "\n".join([
        "import sys, torch, cute_moe",
        textwrap.dedent(setup).strip(),
        "try:",
        textwrap.indent(textwrap.dedent(call).strip(), "    "),
        "    torch.cuda.synchronize()",
        "except RuntimeError as exc:",
        "    print('RAISED', str(exc).splitlines()[0])",
        "    sys.exit(3)",
        "print('NO ERROR')",
    ])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 3, f"the call did not stop with an error (exit {proc.returncode}):\n{out}"
    return out


def _worker_process(worker, rank, world, port, args, errors) -> None:
    """A spawned process of run_workers: the worker, then an exit that skips the
    interpreter's teardown. Once the worker has returned, its checks are done and its
    failures reported; what teardown can still do is abort in a library's threads (CI saw
    a gloo worker SIGABRT with "terminate called without an active exception" after its
    final barrier and destroy_process_group), which says nothing about the test."""
    import traceback
    code = 0
    try:
        worker(rank, world, port, *args, errors)
    except SystemExit as exc:  # sys.exit(n) in a worker: its code, as without this wrapper
        code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
    except BaseException:
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def run_workers(worker, world: int, *args, timeout: float = 300) -> None:
    """Runs worker(rank, world, port, *args, errors) in `world` spawned processes (a
    distributed test: `port` is a free local TCP port for init_process_group, `errors` a
    queue for the worker's failure messages) and asserts that every one exited cleanly
    with nothing reported."""
    import socket

    import torch.multiprocessing as mp
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    errors = ctx.SimpleQueue()
    procs = [ctx.Process(target=_worker_process, args=(worker, rank, world, port, args, errors))
             for rank in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=timeout)
    msgs = []
    while not errors.empty():
        msgs.append(errors.get())
    codes = [p.exitcode for p in procs]
    assert not msgs and all(c == 0 for c in codes), msgs or codes


class OpLog(TorchDispatchMode):
    """Records the cute_moe ops dispatched while it is active: their names (calls) and,
    in the same order, their arguments as dispatched (args: (args, kwargs) pairs)."""

    def __init__(self):
        super().__init__()
        self.calls = []
        self.args = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "cute_moe":
            self.calls.append(func.__name__.split(".")[0])
            self.args.append((args, kwargs or {}))
        return func(*args, **(kwargs or {}))


def assert_empty_batch(moe: torch.nn.Module, shapes, dtype: torch.dtype, device=None) -> None:
    """An MoE layer on empty batches of each shape (0 tokens): an output of that shape and
    dtype, and exact zero gradients for every parameter."""
    for shape in shapes:
        x = torch.randn(*shape, device=device, dtype=dtype, requires_grad=True)
        out = moe(x)
        assert out.shape == shape and out.dtype == dtype
        out.sum().backward()
        assert x.grad.shape == shape
        for n, p in moe.named_parameters():
            assert p.grad is not None and p.grad.shape == p.shape, n
            assert torch.count_nonzero(p.grad) == 0, n
        moe.zero_grad(set_to_none=True)
