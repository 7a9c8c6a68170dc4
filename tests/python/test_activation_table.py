# Every consumer of the activation table (cute_moe/activations.py) agrees with it: the
# references compute exactly its activations, gated ones need even widths and halve them,
# the default limits and the default activation and alpha come from it, and the op
# kernels fill in the schema's own defaults. CPU only; the op-level test needs the library.
import inspect

import pytest
import torch

import cute_moe
from cute_moe import loading
from cute_moe import reference as ref
from cute_moe.activation_args import (GATED_ACTIVATIONS, LIMIT_DEFAULT, check_activation,
                                      resolve_limit, up_width)
from cute_moe.activations import ACTIVATIONS, DEFAULT_ACTIVATION, DEFAULT_ALPHA
from cute_moe.bench import BenchConfig
from cute_moe.bench.__main__ import parse_args
from cute_moe.nn import GroupedExperts, MoE

BF16, F64 = torch.bfloat16, torch.float64
NAMES = tuple(ACTIVATIONS)

# Every public callable with an activation argument, and the defaults it must have.
WITH_ACTIVATION = [cute_moe.expert_ffn, cute_moe.grouped_mm_act_gathered, MoE, GroupedExperts,
                   ref.ReferenceMoE, ref.act_ref, ref.act_bwd_ref, ref.activation_ref,
                   ref.grouped_mm_act_ref, ref.grouped_mm_act_gathered_ref,
                   ref.grouped_mm_act_bwd_ref, ref.expert_ffn_ref, ref.experts_ref,
                   ref.glu_halves_ref]
# Those whose limit means "the activation's default" when not given.
WITH_DEFAULT_LIMIT = [cute_moe.expert_ffn, cute_moe.grouped_mm_act_gathered, MoE, GroupedExperts,
                      ref.ReferenceMoE, loading.from_hf_gpt_oss,
                      loading.load_torchtitan_grouped_experts, loading.from_torchtitan_moe]
WITH_ALPHA = WITH_ACTIVATION + [cute_moe.grouped_mm_swiglu, cute_moe.grouped_mm_downproj,
                                ref.swiglu_oai_ref, ref.swiglu_oai_bwd_ref,
                                ref.grouped_mm_swiglu_ref, ref.grouped_mm_swiglu_bwd_ref,
                                loading.load_torchtitan_grouped_experts,
                                loading.from_torchtitan_moe]


def _default(fn, name):
    return inspect.signature(fn).parameters[name].default


def test_the_table():
    assert DEFAULT_ACTIVATION in ACTIVATIONS
    assert all(name == act.name for name, act in ACTIVATIONS.items())
    assert GATED_ACTIVATIONS == tuple(n for n, a in ACTIVATIONS.items() if a.gated)
    assert ref.GATED_ACTIVATIONS == ref.GATED == GATED_ACTIVATIONS
    assert ref.ACTIVATIONS is ACTIVATIONS


@pytest.mark.parametrize("fn", WITH_ACTIVATION, ids=lambda f: f.__qualname__)
def test_default_activation(fn):
    assert _default(fn, "activation") == DEFAULT_ACTIVATION


@pytest.mark.parametrize("fn", WITH_DEFAULT_LIMIT, ids=lambda f: f.__qualname__)
def test_limit_sentinel(fn):
    assert _default(fn, "limit") == LIMIT_DEFAULT


@pytest.mark.parametrize("fn", WITH_ALPHA, ids=lambda f: f.__qualname__)
def test_default_alpha(fn):
    params = inspect.signature(fn).parameters
    (name,) = [n for n in ("alpha", "swiglu_alpha") if n in params]
    assert params[name].default in (DEFAULT_ALPHA, None)  # None: from_hf_gpt_oss's "the module's"


def test_bench_takes_the_tables_activations():
    assert BenchConfig("t", 1, 8, 8, 2, 1).activation == DEFAULT_ACTIVATION
    for name in NAMES:
        assert parse_args(["--activation", name]).configs[0].activation == name
    with pytest.raises(SystemExit):
        parse_args(["--activation", "gelu"])


@pytest.mark.parametrize("name", NAMES)
def test_default_limit_resolves_from_the_table(name):
    want = ACTIVATIONS[name].default_limit
    assert resolve_limit(name, LIMIT_DEFAULT) == want == ref.default_limit(name)
    assert resolve_limit(name, None) is None
    assert GroupedExperts(8, 4, 2, activation=name).limit == want
    assert MoE(8, 4, 2, 1, activation=name).experts.limit == want
    assert ref.ReferenceMoE(8, 4, 2, 1, activation=name).limit == want


@pytest.mark.parametrize("name", NAMES)
def test_references_compute_every_activation(name):
    gated = ACTIVATIONS[name].gated
    pre = torch.randn(3, 8, dtype=F64) * 4
    limit = ACTIVATIONS[name].default_limit
    h = ref.act_ref(pre, name, DEFAULT_ALPHA, limit)
    assert h.shape == (3, 4 if gated else 8) and up_width(name, 4) == (8 if gated else 4)
    assert torch.equal(ref.activation_ref(pre, name, DEFAULT_ALPHA, limit), h)
    assert ref.act_bwd_ref(torch.ones_like(h), pre, name, DEFAULT_ALPHA, limit).shape == pre.shape
    check_activation(name, limit, "test")
    if gated:  # the same pairs given as two tensors (the [gate | linear] halves' slices)
        assert torch.equal(ref.glu_halves_ref(pre[..., 0::2], pre[..., 1::2], name,
                                              DEFAULT_ALPHA, limit), h)
    else:
        with pytest.raises(ValueError, match="gated activation"):
            ref.glu_halves_ref(pre, pre, name)


def test_unknown_activations_are_rejected_everywhere():
    pre = torch.randn(2, 4)
    for fn in (ref.act_ref, ref.activation_ref):
        with pytest.raises(ValueError, match="activation"):
            fn(pre, "gelu")
    with pytest.raises(ValueError, match="activation"):
        ref.act_bwd_ref(pre, pre, "gelu")
    with pytest.raises(ValueError, match="activation"):
        GroupedExperts(8, 4, 2, activation="gelu")
    with pytest.raises(ValueError, match="activation: expected one of"):
        check_activation("gelu", None, "test")


@pytest.mark.parametrize("name", NAMES)
def test_gated_activations_need_even_widths(name):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 8, generator=g).to(BF16)
    offs = torch.tensor([3, 6], dtype=torch.int32)
    w_up = (torch.randn(2, 8, 5, generator=g) / 3).to(BF16)  # odd: 5 columns
    if ACTIVATIONS[name].gated:
        w_down = torch.randn(2, 2, 8, generator=g).to(BF16)
        with pytest.raises(ValueError, match="w_up: expected an even"):
            cute_moe.expert_ffn(x, w_up, w_down, offs, activation=name)
    else:  # an odd width is an ordinary intermediate width
        w_down = torch.randn(2, 5, 8, generator=g).to(BF16)
        assert cute_moe.expert_ffn(x, w_up, w_down, offs, activation=name).shape == (6, 8)


def test_limits_apply_to_gated_activations_only():
    for name, act in ACTIVATIONS.items():
        if act.gated:
            check_activation(name, 3.0, "test")
        else:
            with pytest.raises(ValueError, match="limit"):
                check_activation(name, 3.0, "test")
    with pytest.raises(ValueError, match="limit"):
        check_activation(DEFAULT_ACTIVATION, -1.0, "test")


def test_expert_ffn_default_limit_is_the_tables():
    g = torch.Generator().manual_seed(1)
    x = (torch.randn(8, 16, generator=g) * 4).to(BF16)  # pre-activations past +-7
    w_up = torch.randn(2, 16, 8, generator=g).to(BF16)
    w_down = (torch.randn(2, 4, 16, generator=g) / 2).to(BF16)
    offs = torch.tensor([5, 8], dtype=torch.int32)
    table = ACTIVATIONS[DEFAULT_ACTIVATION].default_limit
    out = cute_moe.expert_ffn(x, w_up, w_down, offs)
    assert torch.equal(out, cute_moe.expert_ffn(x, w_up, w_down, offs,
                                                activation=DEFAULT_ACTIVATION, limit=table))
    assert not torch.equal(out, cute_moe.expert_ffn(x, w_up, w_down, offs, limit=None))


@pytest.mark.skipif(not cute_moe.library_loaded(), reason="the op library is not loaded")
@pytest.mark.parametrize("name", [n for n in NAMES if n != "none"])
def test_op_kernels_take_the_schema_defaults(name):
    """The dispatcher leaves out trailing arguments equal to the schema's defaults; the
    CPU and fake kernels must then compute with those, whatever the schema says."""
    g = torch.Generator().manual_seed(2)
    x = torch.randn(6, 8, generator=g).to(BF16)
    w = (torch.randn(2, 8, 8, generator=g) / 3).to(BF16)
    offs = torch.tensor([2, 6], dtype=torch.int32)
    schema = torch.ops.cute_moe.grouped_mm_act.default._schema
    defaults = {a.name: a.default_value for a in schema.arguments if a.has_default_value()}
    h, pre = torch.ops.cute_moe.grouped_mm_act(x, w, offs, None, None, name,
                                               defaults["alpha"], defaults["limit"])
    want_h, want_pre = ref.grouped_mm_act_ref(x, w, offs, None, None, name, defaults["alpha"],
                                              defaults["limit"])
    assert torch.equal(h, want_h) and torch.equal(pre, want_pre)
