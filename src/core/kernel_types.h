// The vocabulary of the dispatch table: a kernel's tile configuration over the axes that
// codegen/kernel_space.py declares (their enums and names: the generated kernel_enums.h).
// Kept apart from the table itself so that the kernel translation units, which need only
// these types, do not recompile when a row is added.
#pragma once

#include "kernel_enums.h"  // generated: Arch, KernelVariant, Act, Schedule, TileRole

namespace cute_moe::detail {

// One compiled kernel: which arch and operands (variant; fixed by the arguments), which
// activation its epilogue computes (a compile-time choice: one kernel per activation keeps
// each epilogue small; a runtime switch made the fused backward instruction-cache bound,
// docs/perf-notes.md), and the CTA tile, cluster and schedule (the heuristic's choice,
// by role).
struct TileConfig {
  KernelVariant variant;
  int tile_m, tile_n, tile_k;
  int cluster_m, cluster_n;
  Schedule schedule;
  Act act = Act::Unfused;
  TileRole role = TileRole::Wide;
  Arch arch = Arch::Sm90;
};

}  // namespace cute_moe::detail
