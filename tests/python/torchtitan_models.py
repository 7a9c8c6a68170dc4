# Tiny torchtitan MoE models (built from configs, no downloads) and torchtitan's training
# step put together from its own components, the way torchtitan.train.Trainer builds and
# runs them (train spec's model class and parallelize function, model converters, optimizer
# and LR-scheduler builders with MoE load balancing, loss, AMP context, gradient clipping).
# Used by the torchtitan integration's tests, bench/bench_torchtitan.py and
# scripts/torchtitan_2gpu.py. Trainer itself needs a tokenizer and an HF dataset; the tests
# feed random tokens instead.
#
# torchtitan's model packages import its HF-datasets dataloader (`datasets`, with pyarrow
# ~40 MB) when imported, though building and training a model never calls it. Where
# `datasets` is not installed (CI's light install, the GPU machine without network), a
# stand-in module is put in its place whose every entry point raises: no torchtitan code
# this file runs touches it.
from __future__ import annotations

import contextlib
import copy
import importlib.util
import sys
import types


def _datasets_stand_in() -> None:
    if importlib.util.find_spec("datasets") is not None:
        return

    def unavailable(*args, **kwargs):
        raise ImportError("datasets is not installed (a stand-in from tests/python/torchtitan_models.py)")

    mod = types.ModuleType("datasets")
    mod.Dataset = type("Dataset", (), {"__init__": unavailable})
    mod.load_dataset = unavailable
    dist = types.ModuleType("datasets.distributed")
    dist.split_dataset_by_node = unavailable
    mod.distributed = dist
    sys.modules["datasets"], sys.modules["datasets.distributed"] = mod, dist


_datasets_stand_in()

import torch  # noqa: E402
import torchtitan.models.gpt_oss  # noqa: E402,F401  (registers the train specs)
import torchtitan.models.qwen3  # noqa: E402,F401
from torchtitan.components.loss import IGNORE_INDEX  # noqa: E402
from torchtitan.config import JobConfig  # noqa: E402
from torchtitan.distributed import ParallelDims  # noqa: E402
from torchtitan.distributed import utils as dist_utils  # noqa: E402
from torchtitan.models.moe import MoEArgs  # noqa: E402
from torchtitan.protocols.model_converter import build_model_converters  # noqa: E402
from torchtitan.protocols.train_spec import get_train_spec  # noqa: E402
from torchtitan.tools import utils as tt_utils  # noqa: E402

import cute_moe.integrations.torchtitan as ctt  # noqa: E402  (registers the "cute_moe" converter)

F32, BF16 = torch.float32, torch.bfloat16


# --- configs ----------------------------------------------------------------------------

def qwen3_args(*, dim=64, inter=32, experts=8, top_k=2, layers=2, vocab=256, heads=4,
               head_dim=16, grouped_mm=True, load_balance=1e-3):
    """A Qwen3-MoE model config (torchtitan's Qwen3ModelArgs), every layer MoE."""
    from torchtitan.models.qwen3 import Qwen3ModelArgs
    return Qwen3ModelArgs(
        vocab_size=vocab, max_seq_len=4096, head_dim=head_dim, dim=dim, n_layers=layers,
        n_heads=heads, n_kv_heads=max(1, heads // 2), qk_norm=True, hidden_dim=4 * dim,
        rope_theta=1000000, moe_enabled=True, moe_inter_dim=inter,
        moe_args=MoEArgs(num_experts=experts, num_shared_experts=0, top_k=top_k,
                         score_func="softmax", route_norm=True, route_scale=1.0,
                         score_before_experts=False, use_grouped_mm=grouped_mm,
                         load_balance_coeff=load_balance))


def gpt_oss_args(*, dim=64, inter=64, experts=8, top_k=4, layers=2, vocab=256, heads=4,
                 head_dim=16, grouped_mm=True, load_balance=1e-3):
    """A GPT-OSS model config (torchtitan's GptOssModelArgs; flex attention, causal)."""
    from torchtitan.models.gpt_oss import GptOssModelArgs
    return GptOssModelArgs(
        vocab_size=vocab, dim=dim, moe_inter_dim=inter, n_layers=layers, head_dim=head_dim,
        n_heads=heads, n_kv_heads=max(1, heads // 2), sliding_window_size=32, max_seq_len=4096,
        attn_mask_type="causal",
        moe_args=MoEArgs(num_experts=experts, num_shared_experts=0, score_func="softmax",
                         route_norm=True, route_scale=1.0, gate_bias=True,
                         score_before_experts=False, top_k=top_k, use_grouped_mm=grouped_mm,
                         load_balance_coeff=load_balance))


ARGS = {"qwen3": qwen3_args, "gpt_oss": gpt_oss_args}


def job_config(name: str, *, seq=64, batch=2, lr=1e-3, steps=10, param_dtype="bfloat16",
               ep=1, dp_shard=-1, max_norm=1.0) -> JobConfig:
    job = JobConfig()
    job.model.name, job.model.flavor = name, "custom"
    job.training.seq_len, job.training.local_batch_size = seq, batch
    job.training.steps, job.training.max_norm = steps, max_norm
    job.training.mixed_precision_param = param_dtype
    job.optimizer.lr = lr
    job.lr_scheduler.warmup_steps = 1
    job.parallelism.expert_parallel_degree = ep
    job.parallelism.data_parallel_shard_degree = dp_shard
    job.activation_checkpoint.mode = "none"
    job.compile.enable = False
    return job


def parallel_dims(job: JobConfig, world_size: int = 1) -> ParallelDims:
    p = job.parallelism
    return ParallelDims(dp_shard=p.data_parallel_shard_degree, dp_replicate=1, cp=1, tp=1, pp=1,
                        ep=p.expert_parallel_degree, etp=1, world_size=world_size)


# --- building, as Trainer does ------------------------------------------------------------

def build_model(name: str, model_args, job: JobConfig, dims: ParallelDims, device, *,
                cute: bool, state_dict=None, seed: int = 0):
    """torchtitan's model `name` from `model_args`: built on the meta device, model
    converters applied (job.model.converters, plus "cute_moe" when `cute`), parallelized
    by the train spec's function, materialized on `device` and initialized by its
    init_weights (seed), or loaded from `state_dict` (same keys and placements)."""
    spec = get_train_spec(name)
    job = copy.deepcopy(job)
    job.model.converters = list(job.model.converters) + (["cute_moe"] if cute else [])
    model_args = copy.deepcopy(model_args)
    model_args.update_from_config(job)
    with torch.device("meta"), tt_utils.set_default_dtype(F32):
        model = spec.model_cls(model_args)
    build_model_converters(job, dims).convert(model)
    model = spec.parallelize_fn(model, dims, job)
    model.to_empty(device=device)
    torch.manual_seed(seed)
    with torch.no_grad():
        model.init_weights(buffer_device=None)
    if state_dict is not None:
        model.load_state_dict(state_dict)
    model.train()
    return model


def ensure_process_group(device_type: str) -> None:
    """A one-process group where none is up: torchtitan's Trainer always runs under
    torchrun, and its MoE load-balancing hook (the expert-bias update of
    build_optimizers_with_moe_load_balancing) builds the world mesh even on one GPU."""
    import torch.distributed as dist
    if dist.is_initialized():
        return
    import socket
    with socket.socket() as sock:  # a free local port for the one-process rendezvous
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    dist.init_process_group("nccl" if device_type == "cuda" else "gloo",
                            init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)


class TrainStep:
    """Trainer.train_step of one model part without PP, CP or gradient accumulation:
    zero_grad; forward under torchtitan's AMP context (FSDP: its mixed precision); loss =
    sum cross-entropy / valid tokens; backward; clip_grad_norm_; optimizers.step (with the
    MoE load-balancing hook); lr_schedulers.step. step() returns the loss, unsynced."""

    def __init__(self, name: str, model, model_args, job: JobConfig, dims: ParallelDims):
        spec = get_train_spec(name)
        self.model, self.model_args, self.job, self.dims = model, model_args, job, dims
        ensure_process_group(next(model.parameters()).device.type)
        self.optimizers = spec.build_optimizers_fn([model], job.optimizer, dims)
        self.lr_schedulers = spec.build_lr_schedulers_fn(self.optimizers, job.lr_scheduler,
                                                         job.training.steps)
        self.loss_fn = spec.build_loss_fn(job, parallel_dims=dims)
        device_type = next(model.parameters()).device.type
        self.amp = dist_utils.maybe_enable_amp(dims, job.training.mixed_precision_param,
                                               device_type) if device_type == "cuda" \
            else contextlib.nullcontext()

    def step(self, inputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        self.optimizers.zero_grad()
        valid = (labels != IGNORE_INDEX).sum()
        if self.dims.dp_enabled:
            valid = dist_utils.dist_sum(valid, self.dims.get_mesh("batch"))
        kwargs = {}
        if getattr(self.model_args, "attn_type", "sdpa") == "flex":
            kwargs["attention_masks"] = self.model.get_attention_masks(inputs, tokenizer=None)
        with self.amp:
            pred = self.model(inputs, **kwargs)
            loss = self.loss_fn(pred, labels) / valid
        del pred
        loss.backward()
        dist_utils.clip_grad_norm_(list(self.model.parameters()), self.job.training.max_norm,
                                   foreach=True, ep_enabled=self.dims.ep_enabled)
        self.optimizers.step()
        self.lr_schedulers.step()
        return loss.detach()


def batches(n: int, *, batch: int, seq: int, vocab: int, device, seed: int = 0):
    """n (inputs, labels) pairs of random tokens (labels: inputs shifted by one)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        t = torch.randint(0, vocab, (batch, seq + 1), generator=g)
        out.append((t[:, :-1].to(device), t[:, 1:].to(device)))
    return out


def experts_of(model) -> list:
    return ctt.experts_modules(model)
