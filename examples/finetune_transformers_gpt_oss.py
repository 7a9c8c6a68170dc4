#!/usr/bin/env python3
# Fine-tunes a small GPT-OSS-architecture model built with HF transformers (from a config:
# nothing is downloaded) on text made here (lines of additions, "347+128=475"), read as
# bytes, with experts_implementation="cute_moe" (the fused SM90 expert kernels), then the
# same steps from the same initial weights with transformers' "grouped_mm"; prints a
# progress bar and the step times, and writes the two loss curves to a PNG (matplotlib,
# pinned in requirements-bench.txt) and a CSV.
#
#   python examples/finetune_transformers_gpt_oss.py                  # one H100/H200, ~1 min
#   python examples/finetune_transformers_gpt_oss.py --device cpu --tiny   # a CPU smoke run
#   python examples/finetune_transformers_gpt_oss.py --implementations cute_moe,cute_moe_fp8
#       # bf16 against FP8 experts (cute_moe.fp8, docs/fp8.md) from the same weights
#
# The defaults: GPT-OSS-20B's MoE dimensions (hidden 2880, 32 experts of width 2880, top-4,
# 64 query and 8 key/value heads of 64) in 2 layers, 8 x 1024 tokens a step, AdamW (fused, as
# HF's Trainer runs it), 100 steps each, bf16: about 1.7B parameters, some 30 GB of GPU
# memory. The only cute_moe lines a training script needs are the import that registers
# "cute_moe" and the experts_implementation argument.
from __future__ import annotations

import argparse
import copy
import csv
import importlib.util
import os
import random
import statistics
import sys
import time

import torch

if importlib.util.find_spec("cute_moe") is None:  # not installed: the repository's copy
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import cute_moe.integrations.transformers  # noqa: E402,F401  (registers "cute_moe")
from transformers import GptOssConfig, GptOssForCausalLM  # noqa: E402

IMPLEMENTATIONS = "cute_moe,grouped_mm"
LAST = 10  # the final loss: the mean of the last LAST steps (one batch's loss is noisy)
VOCAB = 256  # bytes
TINY = dict(steps=8, batch=2, seq=64, hidden=64, inter=32, experts=4, top_k=2, heads=4,
            head_dim=16, kv_heads=1, lr=3e-3)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Fine-tune a small GPT-OSS-architecture model with "
                                "experts_implementation='cute_moe', then 'grouped_mm' from the "
                                "same weights, and plot both loss curves.")
    p.add_argument("--device", default="cuda", help="cuda (an SM90 GPU for cute_moe) or cpu")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--hidden", type=int, default=2880)
    p.add_argument("--inter", type=int, default=2880, help="each expert's intermediate width")
    p.add_argument("--experts", type=int, default=32)
    p.add_argument("--top-k", type=int, default=4)
    p.add_argument("--heads", type=int, default=64, help="query heads")
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--dtype", choices=("bf16", "fp32"), default=None,
                   help="default: bf16 on cuda (what the kernels take), fp32 on cpu")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="finetune_gpt_oss_out", help="folder for the PNG and CSV")
    p.add_argument("--implementations", default=IMPLEMENTATIONS,
                   help="experts implementations to run in turn from the same weights, comma "
                        "separated; the first is compared with the others (default: "
                        f"{IMPLEMENTATIONS}; cute_moe_fp8 runs the expert GEMMs in FP8)")
    p.add_argument("--optimizer", choices=("fused", "foreach"), default="fused",
                   help="torch's AdamW implementation on a GPU: fused (one kernel over all "
                        "parameters; HF Trainer's default since torch 2.8) or foreach")
    p.add_argument("--fp8-weight-grads", action="store_true",
                   help="cute_moe_fp8 with its weight gradients in FP8 too (all six GEMMs; "
                        "cute_moe.fp8_ffn.FP8_WEIGHT_GRADS; by default chosen by shape, "
                        "cute_moe.fp8_ffn.fp8_weight_grads_for: bf16 at this example's sizes)")
    p.add_argument("--tiny", action="store_true",
                   help="defaults for a few steps of a tiny model (a CPU smoke run)")
    if p.parse_known_args(argv)[0].tiny:
        p.set_defaults(**TINY)
    args = p.parse_args(argv)
    if args.dtype is None:
        args.dtype = "bf16" if args.device.startswith("cuda") else "fp32"
    return args


# --- data: lines of additions, as bytes -------------------------------------------------------

def make_text(num_chars: int, seed: int) -> str:
    rng = random.Random(seed)
    lines, size = [], 0
    while size < num_chars:
        a, b = rng.randrange(1000), rng.randrange(1000)
        line = f"{a}+{b}={a + b}\n"
        lines.append(line)
        size += len(line)
    return "".join(lines)


def make_batches(args) -> list[torch.Tensor]:
    """The same `steps` batches (batch, seq) of byte ids for every run."""
    data = torch.tensor(list(make_text(args.batch * args.seq * 64, args.seed).encode()),
                        dtype=torch.long)
    g = torch.Generator().manual_seed(args.seed)
    starts = torch.randint(0, data.numel() - args.seq, (args.steps, args.batch), generator=g)
    return [torch.stack([data[s:s + args.seq] for s in row.tolist()]) for row in starts]


# --- the model ------------------------------------------------------------------------------

def build_model(args) -> GptOssForCausalLM:
    config = GptOssConfig(
        vocab_size=VOCAB, hidden_size=args.hidden, intermediate_size=args.inter,
        num_hidden_layers=args.layers, num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads, head_dim=args.head_dim,
        num_local_experts=args.experts, num_experts_per_tok=args.top_k,
        max_position_embeddings=args.seq, sliding_window=min(128, args.seq),
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        attn_implementation="eager",  # GPT-OSS's attention sinks: eager or flash/flex kernels
        experts_implementation="cute_moe")
    torch.manual_seed(args.seed)
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    with torch.device(args.device):
        model = GptOssForCausalLM(config).to(dtype)
    return model


# --- training -------------------------------------------------------------------------------

def progress(steps: int, label: str):
    """tqdm when installed (transformers brings it), else a bar printed in place."""
    try:
        from tqdm import tqdm
        return tqdm(total=steps, desc=label, unit="step", dynamic_ncols=True)
    except ImportError:
        return _TextBar(steps, label)


class _TextBar:
    def __init__(self, total: int, label: str):
        self.total, self.label, self.n, self.postfix = total, label, 0, ""

    def set_postfix_str(self, text: str) -> None:
        self.postfix = text

    def update(self, n: int = 1) -> None:
        self.n += n
        done = int(30 * self.n / self.total)
        print(f"\r{self.label} [{'#' * done}{'.' * (30 - done)}] {self.n}/{self.total} "
              f"{self.postfix}", end="", flush=True)

    def close(self) -> None:
        print()


def train(base: GptOssForCausalLM, implementation: str, batches, args) -> dict:
    """AdamW on a copy of `base` with experts_implementation=`implementation`: the loss
    and the time of each step, and the peak memory."""
    model = copy.deepcopy(base)
    model.set_experts_implementation(implementation)
    model.train()
    cuda = args.device.startswith("cuda")
    fused = cuda and getattr(args, "optimizer", "foreach") == "fused"
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0, fused=fused or None)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    losses, times = [], []
    bar = progress(len(batches), f"{implementation:>10}")
    for ids in batches:
        ids = ids.to(args.device)
        start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        losses.append(loss.item())  # waits for the step
        times.append(time.perf_counter() - start)
        bar.set_postfix_str(f"loss {losses[-1]:.3f}")
        bar.update(1)
    bar.close()
    peak = torch.cuda.max_memory_allocated() / 2**30 if cuda else None
    del model, opt
    warm = times[min(5, len(times) - 1):]  # the first steps include lazy initialisation
    return dict(losses=losses, step_ms=1e3 * statistics.median(warm), peak_gib=peak)


# --- output ---------------------------------------------------------------------------------

def final(run: dict) -> float:
    return statistics.fmean(run["losses"][-LAST:])


def write_csv(path: str, runs: dict) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["step"] + [f"loss_{name}" for name in runs])
        for i, row in enumerate(zip(*(r["losses"] for r in runs.values()))):
            w.writerow([i + 1] + [f"{x:.6f}" for x in row])


def write_png(path: str, runs: dict, title: str) -> bool:
    """The loss curves; False when matplotlib is not installed."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for (name, r), style in zip(runs.items(), ("-", "--", ":", "-.")):  # dashed on top: all visible
        label = f"{name} ({r['step_ms']:.1f} ms/step)"
        ax.plot(range(1, len(r["losses"]) + 1), r["losses"], style, label=label, linewidth=1.4)
    ax.set_xlabel("step")
    ax.set_ylabel("training loss")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.fp8_weight_grads:
        from cute_moe import fp8_ffn
        fp8_ffn.FP8_WEIGHT_GRADS = True
    batches = make_batches(args)
    base = build_model(args)
    n_params = sum(p.numel() for p in base.parameters())
    tokens = args.batch * args.seq
    print(f"GPT-OSS architecture: {args.layers} layers, hidden {args.hidden}, {args.experts} "
          f"experts of width {args.inter} (top-{args.top_k}), {n_params / 1e6:.1f}M parameters, "
          f"{args.dtype} on {args.device}; {args.steps} steps of {tokens} tokens")
    names = [n.strip() for n in args.implementations.split(",") if n.strip()]
    runs = {name: train(base, name, batches, args) for name in names}
    for name, r in runs.items():
        peak = "" if r["peak_gib"] is None else f", peak memory {r['peak_gib']:.2f} GiB"
        print(f"{name:>12}: final loss {final(r):.4f} (mean of the last {min(LAST, len(r['losses']))} "
              f"steps; last step {r['losses'][-1]:.4f}), median step {r['step_ms']:.1f} ms{peak}")
    first = runs[names[0]]
    for name in names[1:]:
        other = runs[name]
        gap = max(abs(a - b) for a, b in zip(first["losses"], other["losses"]))
        rel = (final(first) - final(other)) / final(other)
        print(f"{name} / {names[0]}: step time {other['step_ms'] / first['step_ms']:.2f}x; "
              f"final loss {names[0]} vs {name} {100 * rel:+.2f}%; largest loss difference "
              f"{gap:.4f}")
    os.makedirs(args.out, exist_ok=True)
    csv_path = os.path.join(args.out, "losses.csv")
    png_path = os.path.join(args.out, "loss_curve.png")
    write_csv(csv_path, runs)
    title = (f"GPT-OSS arch., {args.layers} layers, {args.experts} experts top-{args.top_k}, "
             f"{tokens} tokens/step, {args.dtype}, {args.device}")
    if write_png(png_path, runs, title):
        print(f"wrote {png_path} and {csv_path}")
    else:
        print(f"matplotlib is not installed, so no PNG (pip install -r requirements-bench.txt); "
              f"wrote {csv_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
