# `python -m cute_moe.bench`: the MoE layer forward and backward of named model configs
# (or a custom shape), cute_moe.nn.MoE against a torchtitan-equivalent PyTorch layer on
# the same weights and inputs in the same run. Progress on stderr, the table on stdout,
# JSON and a PNG chart on disk. Needs a Hopper GPU (exit 2 otherwise), exit 1 when the
# two layers disagree.
#
#   python -m cute_moe.bench [--config gpt-oss-20b,qwen3-30b-a3b] [--check]
#   python -m cute_moe.bench --tokens 8192 --hidden 4096 --inter 1536 --experts 64 --topk 6
from __future__ import annotations

import argparse
import datetime
import os
import sys

import torch

from ..activations import ACTIVATIONS, DEFAULT_ACTIVATION
from .configs import CONFIGS, DEFAULT_CONFIGS

CUSTOM_FLAGS = ("tokens", "hidden", "inter", "experts", "topk", "activation", "no_bias")
EXIT_MISMATCH, EXIT_UNAVAILABLE = 1, 2


def parse_args(argv=None):
    ap = argparse.ArgumentParser(
        prog="python -m cute_moe.bench",
        description="MoE layer forward/backward: cute-moe vs a torchtitan-style PyTorch "
                    "layer (torch._grouped_mm), same weights and inputs, same run. Needs an "
                    "NVIDIA Hopper GPU (SM90).")
    ap.add_argument("--config", default=None,
                    help=f"comma-separated named configs, from {', '.join(CONFIGS)} "
                         f"(default: {','.join(DEFAULT_CONFIGS)})")
    ap.add_argument("--list", action="store_true", help="list the named configs and exit")
    g = ap.add_argument_group("custom shape (overrides the single --config given, else "
                              "gpt-oss-20b)")
    g.add_argument("--tokens", type=int, help="T, tokens")
    g.add_argument("--hidden", type=int, help="H, model width (a multiple of 8)")
    g.add_argument("--inter", type=int, help="I, expert intermediate width (a multiple of 8)")
    g.add_argument("--experts", type=int, help="E, number of experts")
    g.add_argument("--topk", type=int, help="k, experts per token")
    g.add_argument("--activation", choices=list(ACTIVATIONS),
                   help=f"the experts' activation (default: the config's; {DEFAULT_ACTIVATION} "
                        "but for qwen3-30b-a3b)")
    g.add_argument("--no-bias", action="store_true", help="no expert or router biases")
    ap.add_argument("--reps", type=int, default=20, help="timed repetitions, median (>= 5)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--check", action="store_true",
                    help="also compare every gradient (input, experts, router) of the two "
                         "layers; x, W_up and W_down must agree to 2e-2 (exit 1 otherwise)")
    ap.add_argument("--json", metavar="PATH",
                    help="results file (default: bench/results/moe-<UTC time>.json when "
                         "./bench/results exists, else ./cute_moe_bench-<UTC time>.json)")
    ap.add_argument("--png", metavar="PATH", help="chart (default: the JSON path with .png)")
    ap.add_argument("--fuse-gather", action="store_true",
                    help="our layer with MoE(fuse_gather=True): the token gather inside the up "
                         "projection's GEMM (less memory, more time on Hopper)")
    # Runs the whole CLI on the CPU at a tiny shape through the reference paths, with
    # wall-clock timing: a smoke run of the command line, numbers mean nothing.
    ap.add_argument("--cpu-smoke", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    names = [n for n in args.config.split(",") if n] if args.config else list(DEFAULT_CONFIGS)
    for n in names:
        if n not in CONFIGS:
            ap.error(f"--config: unknown config {n!r}; choose from {', '.join(CONFIGS)}")
    if not names:
        ap.error("--config: name at least one config")
    configs = [CONFIGS[n] for n in names]
    custom = {f: getattr(args, f) for f in CUSTOM_FLAGS if getattr(args, f) not in (None, False)}
    if custom:
        if args.config and len(names) > 1:
            ap.error("custom shape flags: give at most one --config to start from")
        base = configs[0] if args.config else CONFIGS["gpt-oss-20b"]
        changes = {k: v for k, v in custom.items() if k != "no_bias"}
        if custom.get("no_bias"):
            changes.update(bias=False, router_bias=False)
        for k in ("tokens", "hidden", "inter", "experts", "topk"):
            if k in changes and changes[k] < 1:
                ap.error(f"--{k}: expected a positive integer, got {changes[k]}")
        configs = [base.with_(name=f"custom({base.name})", note="custom shape", **changes)]
    for c in configs:
        if c.hidden % 8 or c.inter % 8:
            ap.error(f"{c.name}: --hidden and --inter must be multiples of 8 (the kernels' "
                     f"16-byte rows), got H={c.hidden}, I={c.inter}")
        if c.topk > c.experts:
            ap.error(f"{c.name}: --topk {c.topk} > --experts {c.experts}")
    if args.reps < 5 or args.warmup < 0:
        ap.error("--reps: at least 5; --warmup: at least 0")
    args.configs = configs
    return args


def hopper_problem() -> str | None:
    """Why this machine cannot run the benchmark, or None."""
    if not torch.cuda.is_available():
        return "no CUDA device is visible (torch.cuda.is_available() is False)"
    cap = torch.cuda.get_device_capability()
    if cap != (9, 0):
        return (f"the GPU is {torch.cuda.get_device_name()} (compute capability "
                f"{cap[0]}.{cap[1]}); the kernels are built for SM90 only")
    return None


def library_problem() -> str | None:
    """Why cute_moe cannot run its fused kernels here, or None (without the op library
    the layer would run the PyTorch references: slow, with host syncs)."""
    import cute_moe
    from cute_moe import _library

    if not cute_moe.library_loaded():
        return (f"the op library is not loaded ({_library.load_error() or 'unknown reason'}); "
                "build it from the repository root with `pip install --no-build-isolation .`")
    return None


class _Progress:
    """One progress line on stderr, rewritten in place on a terminal."""

    def __init__(self, total: int):
        self.total, self.index, self.name = total, 0, ""
        self.tty = sys.stderr.isatty()

    def config(self, name: str):
        self.index += 1
        self.name = name

    def __call__(self, msg: str):
        line = f"[{self.index}/{self.total}] {self.name}: {msg}"
        if self.tty:
            sys.stderr.write("\r\033[K" + line)
        else:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()

    def done(self):
        if self.tty:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()


def _default_json(stamp: str) -> str:
    if os.path.isdir(os.path.join("bench", "results")):
        return os.path.join("bench", "results", f"moe-{stamp}.json")
    return f"cute_moe_bench-{stamp}.json"


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.list:
        for c in CONFIGS.values():
            print(f"{c.name:14s} T={c.tokens} H={c.hidden} I={c.inter} E={c.experts} "
                  f"k={c.topk} {c.activation}{'' if c.bias else ' no-bias'}  {c.note}")
        return 0
    if args.cpu_smoke:
        device, dev_name = "cpu", "cpu (smoke run: numbers mean nothing)"
    else:
        why = hopper_problem()
        if why:
            print(f"cute_moe.bench: needs an NVIDIA Hopper GPU (SM90: H100 or H200), but {why}. "
                  "Nothing was measured.", file=sys.stderr)
            return EXIT_UNAVAILABLE
        why = library_problem()
        if why:
            print(f"cute_moe.bench: cannot run the fused kernels: {why}", file=sys.stderr)
            return EXIT_UNAVAILABLE
        device, dev_name = "cuda", torch.cuda.get_device_name()

    import cute_moe

    from .report import format_table, git_commit, write_json, write_png
    from .runner import AGREE_TOL, run_config

    now = datetime.datetime.now(datetime.timezone.utc)
    progress = _Progress(len(args.configs))
    rows = []
    for cfg in args.configs:
        progress.config(cfg.name)
        rows.append(run_config(cfg, reps=args.reps, warmup=args.warmup, seed=args.seed,
                               check=args.check, say=progress, device=device,
                               cpu_smoke=args.cpu_smoke, fuse_gather=args.fuse_gather))
    progress.done()
    print(f"device: {dev_name}; torch {torch.__version__}; cute_moe {cute_moe.__version__}")
    print(format_table(rows))

    bad = [(r["config"]["name"], k, v) for r in rows for k, v in r["mismatch"].items()]
    for name, k, v in bad:
        print(f"MISMATCH {name} {k}: relative difference {v:.2e} > {AGREE_TOL}",
              file=sys.stderr)
    if args.check:
        for r in rows:
            diffs = ", ".join(f"{k} {v:.1e}" for k, v in r["rel_diff"].items())
            print(f"{r['config']['name']} relative differences: {diffs}")

    stamp = now.strftime("%Y%m%d-%H%M%S")
    json_path = args.json or _default_json(stamp)
    meta = dict(device=dev_name, capability=(list(torch.cuda.get_device_capability())
                                             if device == "cuda" else None),
                torch=torch.__version__, cuda=torch.version.cuda,
                cute_moe=cute_moe.__version__, date=now.isoformat(), git_commit=git_commit(),
                command=" ".join(["python -m cute_moe.bench"] + (sys.argv[1:] if argv is None
                                                                  else list(argv))),
                reps=args.reps, warmup=args.warmup, seed=args.seed, check=args.check,
                fuse_gather=args.fuse_gather,
                timing=("wall clock (CPU smoke run)" if args.cpu_smoke else "CUDA events")
                + ", median; forward = the training forward (autograd graph recorded); "
                "backward = autograd.grad of the input and all parameters alone, after an "
                "untimed forward; fwd_bwd = their sum",
                baseline="cute_moe.reference.ReferenceMoE(impl='grouped_mm'): "
                         "torchtitan-style, sharing the layer's parameter tensors")
    write_json(json_path, meta, rows)
    print(f"wrote {json_path}", file=sys.stderr)
    png_path = args.png or os.path.splitext(json_path)[0] + ".png"
    if write_png(png_path, rows, f"{dev_name}, cute-moe {cute_moe.__version__} "
                                 f"({(meta['git_commit'] or 'no commit')[:10]})"):
        print(f"wrote {png_path}", file=sys.stderr)
    else:
        print("cute_moe.bench: matplotlib is not installed, so no chart was written "
              "(pip install -r requirements-bench.txt: the pinned matplotlib)", file=sys.stderr)
    return EXIT_MISMATCH if bad else 0


if __name__ == "__main__":
    sys.exit(main())
