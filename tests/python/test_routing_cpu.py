# CPU tests of the routing ops (top_k, sort_by_expert): their CPU kernels (the references)
# and fake kernels, the references' order for equal values, NaN and out-of-range ids, and
# the argument checks every path shares. The kernels themselves: test_routing_gpu.py.

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import cute_moe
from cute_moe.nn import dispatch
from cute_moe.ops.routing import check_sort_by_expert_args, check_top_k_args
from cute_moe.reference.routing import sort_by_expert_ref, top_k_ref

needs_library = pytest.mark.skipif(not cute_moe.library_loaded(), reason="the op library is not loaded")


def test_top_k_ref_orders_equal_values_by_column_and_nan_first():
    logits = torch.tensor([[1.0, 3.0, 3.0, float("nan"), -0.0, 0.0, 3.0]])
    v, i = top_k_ref(logits, 6)
    assert i.tolist() == [[3, 1, 2, 6, 0, 4]]
    assert torch.isnan(v[0, 0]) and v[0, 1:4].tolist() == [3.0, 3.0, 3.0]


def test_sort_ref_puts_out_of_range_ids_past_every_expert():
    ids = torch.tensor([[2, 9], [-1, 0], [2, 1]])
    s = sort_by_expert_ref(ids, 3, torch.arange(6.0).view(3, 2))
    # entries (expert): 0 (2), 1 (pad), 2 (pad), 3 (0), 4 (2), 5 (1) -> 3, 5, 0, 4, 1, 2
    assert s.offs.tolist() == [1, 2, 4]
    assert s.row_token.tolist() == [1, 2, 0, 2, 0, 1]
    assert s.prob.tolist() == [3.0, 5.0, 0.0, 4.0, 1.0, 2.0]
    assert s.token_rows.view(-1).tolist() == [2, 4, 5, 0, 3, 1]


@needs_library
def test_cpu_kernels_are_the_references():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(50, 40, generator=g)
    v, i = torch.ops.cute_moe.top_k(logits, 5)
    want_v, want_i = top_k_ref(logits, 5)
    assert torch.equal(v, want_v) and torch.equal(i, want_i)
    ids = torch.randint(-1, 9, (50, 3), generator=g)
    w = torch.rand(50, 3, generator=g)
    got = torch.ops.cute_moe.sort_by_expert(ids, 8, w)
    want = sort_by_expert_ref(ids, 8, w)
    for a, b in zip(got, want):
        assert torch.equal(a, b)
    assert torch.ops.cute_moe.sort_by_expert(ids, 8)[3].numel() == 0


@needs_library
def test_fake_kernels_give_the_shapes():
    with FakeTensorMode():
        v, i = torch.ops.cute_moe.top_k(torch.empty(7, 32), 4)
        assert v.shape == (7, 4) and i.dtype == torch.int64
        rt, tr, offs, prob = torch.ops.cute_moe.sort_by_expert(
            torch.empty(7, 4, dtype=torch.int64), 32, torch.empty(7, 4))
        assert rt.shape == (28,) and tr.shape == (7, 4) and offs.shape == (32,) and prob.shape == (28,)
        assert rt.dtype == tr.dtype == offs.dtype == torch.int32


@pytest.mark.parametrize("args,what", [
    ((torch.randn(4, 8).double(), 2), "float32"), ((torch.randn(4, 8), 9), "k"),
    ((torch.randn(4, 513), 2), "columns"), ((torch.randn(8, 4).t(), 2), "contiguous"),
    ((torch.randn(4, 8), 2.0), "an int")])
def test_top_k_checks(args, what):
    with pytest.raises(ValueError, match=what):
        check_top_k_args(*args)


@pytest.mark.parametrize("args,what", [
    ((torch.zeros(4, 2), 4), "int64 or torch.int32"), ((torch.zeros(4, dtype=torch.int64), 4), "(T, k)"),
    ((torch.zeros(4, 2, dtype=torch.int64), 0), "num_experts"),
    ((torch.zeros(4, 2, dtype=torch.int64), 4, torch.zeros(4, 3)), "shape"),
    ((torch.zeros(4, 2, dtype=torch.int64), 4, torch.zeros(4, 2).half()), "float32")])
def test_sort_checks(args, what):
    with pytest.raises(ValueError, match=what):
        check_sort_by_expert_args(*args)


def test_dispatch_on_the_cpu_treats_negative_ids_as_padding():
    d = dispatch.sort_by_expert(torch.tensor([[0, -3], [1, 0]]), 2)
    assert d.offs.tolist() == [2, 3]  # the -3 is not one of expert 0's rows
    assert d.row_token.tolist() == [0, 1, 1, 0]
