#!/usr/bin/env python3
# A full training step of an HF transformers MoE model (2 layers, built from a config, same
# weights and batches) with experts_implementation="grouped_mm" (transformers' own:
# torch._grouped_mm with the activation and bias unfused) against "cute_moe", in the same
# run: median step ms (bf16, AdamW) and peak memory, at GPT-OSS-20B's MoE
# dimensions (hidden 2880, 32 experts of 2880, top-4; the fused route) and Qwen3-30B-A3B's
# (hidden 2048, 128 experts of 768, top-8; HF's [gate; up] halves, read in place by the fused
# kernels). "grouped_mm" runs first, so any advantage of a GPU
# fresh from idle goes to the baseline. Table on stdout.
#
# The step is what HF's Trainer runs by default: fused AdamW (--optimizer foreach for
# torch's other one), Qwen3-MoE's attention through SDPA (--attn eager for the eager
# softmax); GPT-OSS's attention sinks run eager either way.
#
# --bound adds "zero_cost": experts that cost nothing (zeros out, zero gradients: only the
# memset of the weight gradients any implementation writes), in the same run. Its step is
# the floor under every experts implementation, so grouped_mm's step over it is the most any
# could gain at these dimensions and settings.
#
#   python bench/bench_hf_step.py [--models gpt-oss-20b,qwen3-30b-a3b] [--steps 25]
#       [--batch 8] [--seq 1024] [--optimizer fused] [--attn sdpa] [--bound] [--json out.json]
from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
from common import ZeroCost, fmt, import_cute_moe, print_columns, run_meta, write_json  # noqa: E402
import finetune_transformers_gpt_oss as example  # noqa: E402  (registers "cute_moe")

IMPLEMENTATIONS = ("grouped_mm", "cute_moe")


def qwen3_model(args):
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM
    config = Qwen3MoeConfig(
        vocab_size=example.VOCAB, hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768,
        num_hidden_layers=args.layers, num_attention_heads=32, num_key_value_heads=4, head_dim=128,
        num_experts=128, num_experts_per_tok=8, norm_topk_prob=True, max_position_embeddings=args.seq,
        attn_implementation=args.attn, experts_implementation="cute_moe")
    torch.manual_seed(args.seed)
    with torch.device("cuda"):
        return Qwen3MoeForCausalLM(config).to(torch.bfloat16)


def gpt_oss_model(args):
    ex_args = example.parse_args(["--layers", str(args.layers), "--seq", str(args.seq),
                                  "--batch", str(args.batch), "--seed", str(args.seed)])
    return example.build_model(ex_args)


ZERO_COST = "zero_cost"


def zero_cost_experts(self, hidden_states, top_k_index, top_k_weights):
    return ZeroCost.apply(hidden_states, top_k_weights, *self.parameters(recurse=False))


def register_zero_cost():
    from transformers.integrations.moe import ExpertsInterface
    ExpertsInterface.register(ZERO_COST, zero_cost_experts)


MODELS = {"gpt-oss-20b": gpt_oss_model, "qwen3-30b-a3b": qwen3_model}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="HF training step: grouped_mm vs cute_moe")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--steps", type=int, default=25, help="per implementation; the median skips 5")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--optimizer", choices=("fused", "foreach"), default="fused",
                    help="torch's AdamW implementation (fused: HF Trainer's default)")
    ap.add_argument("--attn", default="sdpa", help="Qwen3-MoE's attn_implementation (GPT-OSS: eager)")
    ap.add_argument("--bound", action="store_true",
                    help="also experts that cost nothing: the floor under any implementation")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_hf_step: needs an SM90 GPU", file=sys.stderr)
        return 2
    import_cute_moe()
    args.device, args.dtype = "cuda", "bf16"  # what example.train reads
    impls = IMPLEMENTATIONS + ((ZERO_COST,) if args.bound else ())
    if args.bound:
        register_zero_cost()
    batches = example.make_batches(args)
    rows, records = [("model", "impl", "step ms", "x", "peak GiB", "final loss")], []
    for name in args.models.split(","):
        base = MODELS[name](args)
        runs = {impl: example.train(base, impl, batches, args) for impl in impls}
        del base
        torch.cuda.empty_cache()
        ref = runs["grouped_mm"]["step_ms"]
        for impl, r in runs.items():
            rows.append((name, impl, fmt(r["step_ms"], ".1f"), fmt(ref / r["step_ms"], ".2f"),
                         fmt(r["peak_gib"], ".2f"), fmt(r["losses"][-1], ".4f")))
            records.append(dict(model=name, impl=impl, **r))
    print_columns(rows, left=2)
    if args.json:
        write_json(args.json, run_meta(steps=args.steps, batch=args.batch, seq=args.seq, layers=args.layers,
                                       optimizer=args.optimizer, attn=args.attn),
                   records)
    return 0


if __name__ == "__main__":
    sys.exit(main())
