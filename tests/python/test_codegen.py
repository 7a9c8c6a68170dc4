# The kernel-space declaration (codegen/kernel_space.py) and what is derived from it: the
# committed Python activation table is current, a broken declaration fails with a sentence,
# and the compiled library holds exactly the declared kernels.
import importlib
import os
import subprocess
import sys

import pytest
import torch

import cute_moe

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CODEGEN = os.path.join(REPO, "codegen")


@pytest.fixture()
def generate(monkeypatch):
    monkeypatch.syspath_prepend(CODEGEN)
    ks = importlib.import_module("kernel_space")
    gen = importlib.reload(importlib.import_module("generate"))
    return gen, ks


def test_python_activation_table_is_current():
    r = subprocess.run([sys.executable, os.path.join(CODEGEN, "generate.py"), "--check-python"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_python_table_matches_the_declaration(generate):
    _, ks = generate
    from cute_moe import activations
    assert list(activations.ACTIVATIONS) == [a.name for a in ks.ACTIVATIONS]
    for a in ks.ACTIVATIONS:
        assert activations.ACTIVATIONS[a.name] == (a.name, a.gated, a.default_limit)
    assert activations.DEFAULT_ACTIVATION == ks.DEFAULT_ACTIVATION
    assert activations.DEFAULT_ALPHA == ks.DEFAULT_ALPHA


def test_a_variant_without_a_wide_tile_is_refused(generate, monkeypatch):
    gen, ks = generate
    tiles = dict(ks.TILES)
    tiles[("sm90", "ActBwd_BRow")] = {"narrow": tiles[("sm90", "RaggedM_BRow")]["narrow"]}
    monkeypatch.setattr(ks, "TILES", tiles)
    with pytest.raises(gen.DeclarationError, match="ActBwd_BRow: every variant needs a 'wide' tile"):
        gen.check_declaration()


def test_a_role_holding_several_tiles_gets_a_kernel_for_each(generate, monkeypatch):
    gen, ks = generate
    tiles = dict(ks.TILES)
    one, two = ks.Tile(128, 192, 64, 2, 1, "Pingpong"), ks.Tile(128, 192, 64, 1, 2, "Pingpong")
    tiles[("sm90", "RaggedK_OutF32")] = {"wide": tiles[("sm90", "RaggedK_OutF32")]["wide"], "mid": (one, two)}
    monkeypatch.setattr(ks, "TILES", tiles)
    gen.check_declaration()
    mid = [(role, gen.kernel_file_stem(*k)) for k in gen.kernels()
           for role in [k[2]] if k[1].enum == "RaggedK_OutF32" and role == "mid"]
    assert mid == [("mid", "sm90_ragged_k_f32_128x192x64_2x1_pong"), ("mid", "sm90_ragged_k_f32_128x192x64_1x2_pong")]
    tiles[("sm90", "RaggedK_OutF32")]["mid"] = (one, two._replace(schedule="Stream"))
    with pytest.raises(gen.DeclarationError, match="RaggedK_OutF32/mid: schedule 'Stream'"):
        gen.check_declaration()


def test_a_twins_only_tile_gets_only_the_limit_free_twins(generate, monkeypatch):
    gen, ks = generate
    coop, pong = ks.Tile(128, 192, 64, 2, 1, "Cooperative"), ks.Tile(128, 192, 64, 2, 1, "Pingpong", twins_only=True)
    tiles = dict(ks.TILES)
    tiles[("sm90", "ActBwd_BCol")] = {"wide": tiles[("sm90", "ActBwd_BCol")]["wide"], "mid": (coop, pong)}
    monkeypatch.setattr(ks, "TILES", tiles)
    gen.check_declaration()
    mid = [gen.kernel_file_stem(*k) for k in gen.kernels() if k[1].enum == "ActBwd_BCol" and k[2] == "mid"]
    cooperative = [m for m in mid if "_coop_" in m]
    assert len(cooperative) == len(ks.ACTIVATIONS) + len(ks.LIMIT_FREE)  # every activation, twins
    assert [m for m in mid if "_pong_" in m] == [f"sm90_act_backward_bcol_128x192x64_2x1_pong_{t.name}"
                                                  for t in ks.LIMIT_FREE]
    # only in a role that has twins
    tiles[("sm90", "ActBwd_BCol")] = {"wide": pong}
    with pytest.raises(gen.DeclarationError, match="ActBwd_BCol/wide: a twins_only tile in a role without"):
        gen.check_declaration()


def test_a_limit_on_an_ungated_activation_is_refused(generate, monkeypatch):
    gen, ks = generate
    acts = tuple(a._replace(default_limit=3.0) if a.name == "srelu" else a for a in ks.ACTIVATIONS)
    monkeypatch.setattr(ks, "ACTIVATIONS", acts)
    with pytest.raises(gen.DeclarationError, match="srelu: only gated activations take a limit"):
        gen.check_declaration()


def test_generated_units_name_their_arch_and_compile_one_row_each(generate, tmp_path):
    gen, _ = generate
    gen.emit_cpp(str(tmp_path))
    units = sorted(os.listdir(tmp_path / "kernels"))
    assert len(units) == len(gen.kernels()) and all(u.startswith("sm90_") for u in units)
    text = (tmp_path / "kernels" / "sm90_act_backward_128x256x64_2x1_coop_swiglu_oai.cu").read_text()
    assert "CUTE_MOE_INSTANTIATE_KERNEL(Sm90, ActBwd_BRow, 128, 256, 64, 2, 1, Cooperative, SwigluOai, Wide)" in text


@pytest.mark.skipif(not cute_moe.library_loaded(), reason="cute_moe op library not loaded")
def test_the_library_holds_exactly_the_declared_kernels(generate):
    gen, _ = generate
    table = list(torch.ops.cute_moe.kernel_table())
    rows = {p: [f"{v.call}:{a.name if a else ''}:{gen.tile_name(t)}" for _, v, _, t, a in gen.kernels(p)]
            for p in (False, True)}  # a default build, or one with -DCUTE_MOE_PROBES=ON
    assert table == rows[False] or table == rows[True]


def test_probe_tiles_only_with_probes_and_never_the_heuristics_pick(generate, monkeypatch):
    gen, ks = generate
    wide = ks.Tile(128, 256, 64, 2, 1, "Cooperative")
    probe = ks.Tile(128, 256, 64, 2, 2, "Cooperative", probe=True)
    monkeypatch.setitem(ks.TILES, ("sm90", "RaggedM_BCol"), {"wide": (wide, probe)})
    gen.check_declaration()
    stems = {p: [gen.kernel_file_stem(*k) for k in gen.kernels(p) if k[1].enum == "RaggedM_BCol"]
             for p in (False, True)}
    assert stems[False] == ["sm90_ragged_m_bcol_128x256x64_2x1_coop"]
    assert stems[True] == stems[False] + ["sm90_ragged_m_bcol_128x256x64_2x2_coop"]
    monkeypatch.setitem(ks.TILES, ("sm90", "RaggedM_BCol"), {"wide": (probe, wide)})
    with pytest.raises(gen.DeclarationError, match="RaggedM_BCol/wide: a probe tile first in its role"):
        gen.check_declaration()
    other_tile = ks.Tile(128, 128, 64, 2, 2, "Cooperative", probe=True)
    monkeypatch.setitem(ks.TILES, ("sm90", "RaggedM_BCol"), {"wide": (wide, other_tile)})
    with pytest.raises(gen.DeclarationError, match="RaggedM_BCol/wide: a probe tile must be a ragged-M"):
        gen.check_declaration()
    monkeypatch.setitem(ks.TILES, ("sm90", "RaggedM_BCol"), {"wide": wide})
    monkeypatch.setitem(ks.TILES, ("sm90", "RaggedK_OutF32"), {"wide": (wide, probe)})
    with pytest.raises(gen.DeclarationError, match="RaggedK_OutF32/wide: a probe tile must be a ragged-M"):
        gen.check_declaration()
