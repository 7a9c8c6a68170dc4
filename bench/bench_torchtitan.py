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
from __future__ import annotations

import argparse
import gc
import os
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "python"))
from common import fmt, import_cute_moe, print_columns, run_meta, write_json  # noqa: E402
import torchtitan_models as tm  # noqa: E402  (registers the "cute_moe" converter)

IMPLS = ("torchtitan", "cute_moe")


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
    model = tm.build_model(name, model_args, job, dims, "cuda", cute=impl == "cute_moe",
                           state_dict=state_dict)
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
    losses = torch.stack(losses)
    if torch.distributed.is_initialized():  # each rank's loss is its share of the global mean
        torch.distributed.all_reduce(losses)
    torch.cuda.synchronize()
    ms = sorted(s.elapsed_time(e) for s, e in times[args.warmup:])
    out = dict(step_ms=ms[len(ms) // 2], losses=[float(v) for v in losses.tolist()],
               peak_gib=(torch.cuda.max_memory_allocated() - before) / 2**30)
    del step, model
    release()
    return out


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
    ap.add_argument("--batch", type=int, default=4, help="per rank")
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
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_torchtitan: needs an SM90 GPU", file=sys.stderr)
        return 2
    import_cute_moe()
    world = setup_distributed(args)
    rank = torch.distributed.get_rank() if world > 1 else 0
    rows = [("model", "experts", "step ms", "tokens/s", "x", "peak GiB (run)", "loss[0]", "loss[-1]",
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
        runs = {impl: run(name, model_args, impl, job, dims, data, sd, args) for impl in IMPLS}
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
        if rank == 0:
            print(f"# {key}: {args.layers} layers, {tokens} tokens/step, world {world}, ep {args.ep} "
                  f"({time.time() - t0:.0f} s)", file=sys.stderr)
    agreement = losses_agreement(records, args.losses_like) if args.losses_like else []
    if rank == 0:
        print(f"torchtitan {args.layers}-layer MoE models, {args.batch}x{args.seq} tokens per rank, "
              f"{world} GPU(s), EP {args.ep}, {torch.cuda.get_device_name()}; losses per step of the "
              "same weights and batches; peak GiB (run): above what was allocated before the model was built")
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
