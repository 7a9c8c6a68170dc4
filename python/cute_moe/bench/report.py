# Output of `python -m cute_moe.bench`: the table on stdout, the JSON record and the PNG
# chart (matplotlib, when installed).
from __future__ import annotations

import json
import os
import subprocess

__all__ = ["align_columns", "format_table", "write_json", "write_png", "git_commit"]


def _fmt(v, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def align_columns(lines, left: int = 1) -> list[str]:
    """The rows of cells as text columns: the first `left` columns left-aligned (names),
    the others right-aligned (numbers)."""
    lines = [[str(v) for v in line] for line in lines]
    widths = [max(len(line[c]) for line in lines) for c in range(len(lines[0]))]
    return ["  ".join(v.ljust(w) if c < left else v.rjust(w) for c, (v, w) in enumerate(zip(line, widths)))
            for line in lines]


def format_table(rows: list[dict]) -> str:
    """One line per config: times (ms), speedups (torchtitan-style / cute-moe), TFLOP/s,
    peak memory, and the relative output difference of the two layers."""
    head = ("config", "T", "M", "fwd ours", "fwd torch", "fwd x", "bwd ours", "bwd torch",
            "bwd x", "f+b ours", "f+b torch", "f+b x", "TF/s fwd ours/torch",
            "TF/s bwd ours/torch", "peak GiB ours/torch", "out diff")
    lines = [head]
    for r in rows:
        gib = [None if r[f"{i}_peak_bytes"] is None else r[f"{i}_peak_bytes"] / 2 ** 30
               for i in ("ours", "torch")]
        cells = [r["config"]["name"], str(r["config"]["tokens"]), str(r["rows"])]
        for k in ("fwd", "bwd", "fwd_bwd"):
            cells += [_fmt(r[f"ours_{k}_ms"], ".2f"), _fmt(r[f"torch_{k}_ms"], ".2f"),
                      _fmt(r[f"speedup_{k}"], ".2f") + "x"]
        cells += [f"{r['ours_fwd_tflops']:.0f}/{r['torch_fwd_tflops']:.0f}",
                  f"{r['ours_bwd_tflops']:.0f}/{r['torch_bwd_tflops']:.0f}",
                  f"{_fmt(gib[0], '.2f')}/{_fmt(gib[1], '.2f')}",
                  _fmt(r["rel_diff"]["out"], ".1e")]
        lines.append(tuple(cells))
    return "\n".join(["MoE layer forward / backward (median ms; x = torchtitan-style / cute-moe; "
                      "TF/s over the expert GEMM FLOPs; peak = memory above the weights and inputs "
                      "during one forward+backward; out diff = ||ours - torch|| / ||torch||)"]
                     + align_columns(lines))


def git_commit() -> str | None:
    """CUTE_MOE_GIT_COMMIT (set where the checkout has no .git, e.g. the GPU machine), else
    HEAD of the checkout this package sits in, else None (an installed copy)."""
    if os.environ.get("CUTE_MOE_GIT_COMMIT"):
        return os.environ["CUTE_MOE_GIT_COMMIT"]
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True, cwd=os.path.dirname(os.path.abspath(__file__))
                              ).stdout.strip() or None
    except (OSError, subprocess.CalledProcessError):
        return None


def write_json(path: str, meta: dict, rows: list[dict]) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(dict(meta=meta, results=rows), f, indent=1)


def write_png(path: str, rows: list[dict], title: str) -> bool:
    """Bar chart of forward and backward ms per config, both implementations, with the
    speedups written on top. False when matplotlib is not installed."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    names = [r["config"]["name"] for r in rows]
    fig, axes = plt.subplots(1, 2, figsize=(max(6.0, 2.2 * len(rows)) * 2, 4.5))
    width = 0.38
    for ax, phase, label in ((axes[0], "fwd", "forward"), (axes[1], "bwd", "backward")):
        xs = range(len(rows))
        ours = [r[f"ours_{phase}_ms"] for r in rows]
        base = [r[f"torch_{phase}_ms"] for r in rows]
        ax.bar([i - width / 2 for i in xs], base, width, label="torchtitan-style (torch)",
               color="#9aa5b1")
        bars = ax.bar([i + width / 2 for i in xs], ours, width, label="cute-moe",
                      color="#2a9d8f")
        for bar, r in zip(bars, rows):
            ax.annotate(f"{r[f'speedup_{phase}']:.2f}x", (bar.get_x() + bar.get_width() / 2,
                                                          bar.get_height()),
                        ha="center", va="bottom", fontsize=9)
        ax.set_xticks(list(xs), names, rotation=15)
        ax.set_ylabel("ms (median)")
        ax.set_title(f"MoE layer {label}")
        ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True
