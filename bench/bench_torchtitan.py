#!/usr/bin/env python3
# Tokens/s of a torchtitan MoE model's training step with torchtitan's default experts
# (torch._grouped_mm, activation and biases unfused, token groups padded to 8) against
# cute_moe's (cute_moe.integrations.torchtitan), same run, same weights, same batches.
# The model is torchtitan's own (Qwen3-MoE, GPT-OSS), a few layers at Qwen3-30B-A3B's MoE
# dimensions (dim 2048, 128 experts of 768, top-8, [gate | up] halves from w1 and w3)
# and GPT-OSS-20B's (dim 2880, 32 experts of 2880, top-4, clamped SwiGLU with biases),
# built and stepped the way torchtitan's Trainer does (tests/python/torchtitan_models.py:
# train spec, model converter "cute_moe", parallelize function, AdamW with MoE load
# balancing, gradient clipping). The default experts run first, so a GPU fresh from idle
# favours the baseline. (cute_moe reads w1 and w3 where they are: its per-call weight
# preparation is torchtitan's own bf16 cast.)
#
# One GPU (fp32 parameters under torchtitan's AMP, as its single-device training):
#   python bench/bench_torchtitan.py [--models qwen3-30b-a3b,gpt-oss-20b] [--layers 2]
#       [--batch 4] [--seq 2048] [--steps 10] [--json out.json]
# Several GPUs (FSDP2 over all ranks, bf16 parameters, expert parallel --ep):
#   torchrun --nproc-per-node 2 bench/bench_torchtitan.py --ep 2   (scripts/torchtitan_2gpu.sh)
# The same global batches on one GPU, to check a multi-GPU run's losses against one GPU's:
#   python bench/bench_torchtitan.py --batches-of 2 --json one.json      (rank 0 and 1's rows)
#   torchrun --nproc-per-node 2 bench/bench_torchtitan.py --ep 2 --losses-like one.json
# --interleave: both models in one process, stepped in turn (a 2-GPU pair's step times drift
# by up to 10% between processes; peak memory is then per step). --bound: a third model whose
# experts cost nothing (zeros out, zero gradients): its tokens/s over torchtitan's is the
# most any experts implementation could gain in that configuration. --profile [--trace DIR]:
# per implementation, two more steps under torch.profiler (wall vs kernel ms, the largest
# kernels; Chrome traces with the host's calls).
from __future__ import annotations

import argparse
import gc
import os
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "python"))
from common import ZeroCost, fmt, import_cute_moe, print_columns, run_meta, write_json  # noqa: E402
import torchtitan_models as tm  # noqa: E402  (registers the "cute_moe" converter)

IMPLS = ("torchtitan", "cute_moe")
ZERO_COST = "zero_cost"  # --bound: experts that cost nothing, the floor under any implementation


class _ZeroCostForward:
    def forward(self, x, num_tokens_per_expert):
        from cute_moe.integrations.torchtitan import _local
        return ZeroCost.apply(x, *(_local(p) for p in self.parameters(recurse=False)))


def build(name, model_args, impl, job, dims, state_dict):
    """`impl`'s model from `state_dict`. zero_cost: cute_moe's conversion (its expert-parallel
    gathers, the cheapest dispatch), then a forward that does nothing."""
    model = tm.build_model(name, model_args, job, dims, "cuda", cute=impl != "torchtitan",
                           state_dict=state_dict)
    if impl == ZERO_COST:
        from cute_moe.integrations.torchtitan import experts_modules
        for m in experts_modules(model):
            m.__class__ = type(f"ZeroCost{type(m).__name__}", (_ZeroCostForward, type(m)), {})
    return model


def qwen3_30b_a3b(args):
    a = tm.qwen3_args(dim=2048, inter=768, experts=128, top_k=8, layers=args.layers,
                      vocab=args.vocab, heads=32, head_dim=128)
    a.n_kv_heads, a.hidden_dim = 4, 6144
    return "qwen3", a


def gpt_oss_20b(args):
    a = tm.gpt_oss_args(dim=2880, inter=2880, experts=32, top_k=4, layers=args.layers,
                        vocab=args.vocab, heads=64, head_dim=64)
    a.n_kv_heads, a.sliding_window_size = 8, 128
    return "gpt_oss", a


MODELS = {"qwen3-30b-a3b": qwen3_30b_a3b, "gpt-oss-20b": gpt_oss_20b}


def setup_distributed(args):
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        torch.distributed.init_process_group("nccl")
    if args.ep > 1 and world % args.ep:
        raise SystemExit(f"--ep {args.ep} must divide the world size {world}")
    return world


def run(name, model_args, impl, job, dims, data, state_dict, args):
    """Trains `impl`'s model from `state_dict` on `data`: per-step ms (CUDA events),
    losses, peak memory above what was allocated before the model was built (its
    parameters, gradients, optimizer states and activations: what the run itself takes)."""
    release()
    before = torch.cuda.memory_allocated()
    model = build(name, model_args, impl, job, dims, state_dict)
    step = tm.TrainStep(name, model, model_args, job, dims)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    losses, times = [], []
    for x, y in data:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        losses.append(step.step(x, y))
        end.record()
        times.append((start, end))
    out = finish(losses, times, args)
    out["peak_gib"] = (torch.cuda.max_memory_allocated() - before) / 2**30
    if args.profile:
        out["profile"] = profile_steps(step, data[-2:], trace_path(args, name, impl))
    del step, model
    release()
    return out


def run_interleaved(name, model_args, impls, job, dims, data, state_dict, args):
    """Both implementations' models from `state_dict`, alive together, trained on `data`
    step by step in turn (the first to step alternates): machine drift and a GPU fresh from
    idle fall on both sides alike. Peak memory here is each step's own (its activations and
    transients: the peak during its steps above what was allocated just before), as the
    other model's parameters and states are allocated too."""
    release()
    steps = {}
    for impl in impls:
        model = build(name, model_args, impl, job, dims, state_dict)
        steps[impl] = tm.TrainStep(name, model, model_args, job, dims)
    torch.cuda.synchronize()
    losses = {impl: [] for impl in impls}
    times = {impl: [] for impl in impls}
    peak = dict.fromkeys(impls, 0)
    for i, (x, y) in enumerate(data):
        for impl in (impls if i % 2 == 0 else impls[::-1]):
            torch.cuda.synchronize()
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            losses[impl].append(steps[impl].step(x, y))
            end.record()
            times[impl].append((start, end))
            torch.cuda.synchronize()
            peak[impl] = max(peak[impl], torch.cuda.max_memory_allocated() - base)
    out = {}
    for impl in impls:
        out[impl] = finish(losses[impl], times[impl], args)
        out[impl]["peak_gib"] = peak[impl] / 2**30
        if args.profile:
            out[impl]["profile"] = profile_steps(steps[impl], data[-2:], trace_path(args, name, impl))
    del steps
    release()
    return out


def trace_path(args, name, impl):
    """Where --trace DIR puts this rank's Chrome trace of `impl`'s profiled steps, or None."""
    if not args.trace:
        return None
    os.makedirs(args.trace, exist_ok=True)
    rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
    return os.path.join(args.trace, f"{name}_{impl}_rank{rank}.json")


def finish(losses, times, args):
    """The median step ms after the warm-up and the losses (summed over ranks)."""
    losses = torch.stack(losses)
    if torch.distributed.is_initialized():  # each rank's loss is its share of the global mean
        torch.distributed.all_reduce(losses)
    torch.cuda.synchronize()
    ms = sorted(s.elapsed_time(e) for s, e in times[args.warmup:])
    return dict(step_ms=ms[len(ms) // 2], losses=[float(v) for v in losses.tolist()])


def profile_steps(step, data, trace=None):
    """torch.profiler over `data`'s steps (after the timed ones): per step, the wall ms,
    the GPU's kernel ms (summed over kernels; overlapping streams count twice) and the
    largest kernels by name, so that a slower step says whether its GPU worked more or
    waited more. With `trace` (a path), the host's calls too, written there as a Chrome
    trace."""
    from torch.profiler import ProfilerActivity, profile
    activities = [ProfilerActivity.CUDA] + ([ProfilerActivity.CPU] if trace else [])
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    with profile(activities=activities) as prof:
        for x, y in data:
            step.step(x, y)
        torch.cuda.synchronize()
    wall = (time.perf_counter() - t0) * 1e3 / len(data)
    if trace:
        prof.export_chrome_trace(trace)
    per = {}
    for e in prof.events():  # the kernels and copies; not the annotations' GPU ranges
        if e.device_type.name == "CUDA" and not e.is_user_annotation:
            per[e.name] = per.get(e.name, 0.0) + e.device_time_total / 1e3 / len(data)
    top = sorted(per.items(), key=lambda kv: -kv[1])
    return dict(wall_ms=wall, gpu_ms=sum(per.values()), top=[(k[:90], v) for k, v in top[:14]])


def release():
    """Frees what earlier models left: an FSDP2 + EP model holds reference cycles, so
    without a collection its ~5 GB stayed allocated into the next run (measured on 2 GPUs:
    whichever implementation ran second showed the first's parameters and states)."""
    gc.collect()
    torch.cuda.empty_cache()


def rank_batches(args, rank):
    """This process's (inputs, labels) per step: rank `rank`'s batches (seeded by the rank),
    or with --batches-of N those of ranks 0..N-1 stacked row-wise."""
    def of(r):
        return tm.batches(args.steps, batch=args.batch, seq=args.seq, vocab=args.vocab,
                          device="cuda", seed=r)
    if args.batches_of <= 1:
        return of(rank)
    per_rank = [of(r) for r in range(args.batches_of)]
    return [tuple(torch.cat(parts) for parts in zip(*step)) for step in zip(*per_rank)]


def losses_agreement(records, path):
    """(model, experts, there's world/EP, max relative loss difference) for every record
    that `path`'s JSON has too."""
    import json
    with open(path) as f:
        there = json.load(f)
    meta = there.get("meta", {})
    where = f"{meta.get('world', '?')} GPU(s), EP {meta.get('ep', '?')}"
    theirs = {(r["model"], r["impl"]): r["losses"] for r in there["results"]}
    rows = []
    for r in records:
        ref = theirs.get((r["model"], r["impl"]))
        if ref is None or len(ref) != len(r["losses"]):
            continue
        rows.append((r["model"], r["impl"], where,
                     fmt(max(abs(a - b) / abs(b) for a, b in zip(r["losses"], ref)), ".1e")))
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="torchtitan training step: default experts vs cute_moe")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=4,
                    help="per rank (torchtitan's default training.local_batch_size is 8)")
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--steps", type=int, default=12, help="per implementation, warm-up included")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--ep", type=int, default=1, help="expert-parallel degree (torchrun)")
    ap.add_argument("--batches-of", type=int, default=0, metavar="N",
                    help="one process: train on the batches N ranks would see together (each "
                         "step the rows of ranks 0..N-1, --batch rows each)")
    ap.add_argument("--losses-like", default=None, metavar="JSON",
                    help="a run's JSON (e.g. one GPU with --batches-of) whose per-step losses "
                         "this run's are compared with, model by model and experts by experts")
    ap.add_argument("--interleave", action="store_true",
                    help="both implementations' models at once, stepped in turn (timing across "
                         "process-to-process drift; peak memory per step, not per run)")
    ap.add_argument("--profile", action="store_true",
                    help="after the timed steps, two more per implementation under torch.profiler: "
                         "rank 0 prints wall vs GPU-kernel ms per step and the largest kernels")
    ap.add_argument("--bound", action="store_true",
                    help="also experts that cost nothing (zero_cost): the floor under any "
                         "implementation's step")
    ap.add_argument("--trace", default=None, metavar="DIR",
                    help="with --profile: each rank's Chrome trace (host calls and kernels) of "
                         "each implementation's profiled steps, written into DIR")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_torchtitan: needs an SM90 GPU", file=sys.stderr)
        return 2
    import_cute_moe()
    world = setup_distributed(args)
    rank = torch.distributed.get_rank() if world > 1 else 0
    rows = [("model", "experts", "step ms", "tokens/s", "x",
             "peak GiB (step)" if args.interleave else "peak GiB (run)", "loss[0]", "loss[-1]",
             "max |dloss|/loss")]
    records = []
    for key in args.models.split(","):
        name, model_args = MODELS[key](args)
        job = tm.job_config(name, seq=args.seq, batch=args.batch, lr=args.lr, steps=args.steps,
                            ep=args.ep, dp_shard=-1)
        dims = tm.parallel_dims(job, world)
        data = rank_batches(args, rank)
        t0 = time.time()
        base = tm.build_model(name, model_args, job, dims, "cuda", cute=False)
        sd = {k: v.detach().clone() for k, v in base.state_dict().items()}
        del base
        impls = IMPLS + ((ZERO_COST,) if args.bound else ())
        if args.interleave:
            runs = run_interleaved(name, model_args, impls, job, dims, data, sd, args)
        else:
            runs = {impl: run(name, model_args, impl, job, dims, data, sd, args) for impl in impls}
        del sd
        torch.cuda.empty_cache()
        tokens = args.batch * args.seq * world * max(1, args.batches_of)
        ref = runs["torchtitan"]
        dloss = max(abs(a - b) / abs(b) for a, b in zip(runs["cute_moe"]["losses"], ref["losses"]))
        for impl, r in runs.items():
            rows.append((key, impl, fmt(r["step_ms"], ".1f"), fmt(tokens / r["step_ms"] * 1e3, ",.0f"),
                         fmt(ref["step_ms"] / r["step_ms"], ".2f"), fmt(r["peak_gib"], ".2f"),
                         fmt(r["losses"][0], ".4f"), fmt(r["losses"][-1], ".4f"),
                         fmt(dloss, ".1e") if impl == "cute_moe" else ""))
            records.append(dict(model=key, impl=impl, tokens_per_step=tokens,
                                tokens_per_s=tokens / r["step_ms"] * 1e3, **r))
            if rank == 0 and "profile" in r:
                p = r["profile"]
                print(f"# profile {key} {impl}: wall {p['wall_ms']:.1f} ms/step, GPU kernels "
                      f"{p['gpu_ms']:.1f} ms/step", file=sys.stderr)
                for k, v in p["top"]:
                    print(f"#   {v:7.2f} ms  {k}", file=sys.stderr)
        if rank == 0:
            print(f"# {key}: {args.layers} layers, {tokens} tokens/step, world {world}, ep {args.ep} "
                  f"({time.time() - t0:.0f} s)", file=sys.stderr)
    agreement = losses_agreement(records, args.losses_like) if args.losses_like else []
    if rank == 0:
        peak = ("peak GiB (step): each step's own, above what was allocated before it (both models "
                "alive, stepped in turn)" if args.interleave else
                "peak GiB (run): above what was allocated before the model was built")
        print(f"torchtitan {args.layers}-layer MoE models, {args.batch}x{args.seq} tokens per rank, "
              f"{world} GPU(s), EP {args.ep}, {torch.cuda.get_device_name()}; losses per step of the "
              f"same weights and batches; {peak}")
        print_columns(rows, left=2)
        if agreement:
            print(f"\nlosses against {os.path.basename(args.losses_like)} (same weights, same global "
                  "batches), max over steps of |loss - loss_there| / loss_there:")
            print_columns([("model", "experts", "there", "max rel diff")] + agreement, left=2)
        if args.json:
            write_json(args.json, run_meta(layers=args.layers, batch=args.batch, seq=args.seq,
                                           world=world, ep=args.ep, batches_of=args.batches_of), records)
    if world > 1:
        torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
