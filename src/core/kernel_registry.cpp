// The runtime view of kernel_table.h: one entry per compiled kernel, in table order.
// The KernelInstance members are defined in the generated translation units.
#include "kernel_registry.h"

#include "heuristics.h"
#include "kernel_table.h"

namespace cute_moe::detail {

const std::vector<KernelEntry>& kernel_registry() {
#define CUTE_MOE_REGISTRY_ENTRY(variant, tm, tn, tk, cm, cn, schedule)                              \
  {TileConfig{KernelVariant::variant, tm, tn, tk, cm, cn, Schedule::schedule},                      \
   tile_config_name(TileConfig{KernelVariant::variant, tm, tn, tk, cm, cn, Schedule::schedule}),    \
   &KernelInstance<KernelVariant::variant, tm, tn, tk, cm, cn, Schedule::schedule>::launch,         \
   &KernelInstance<KernelVariant::variant, tm, tn, tk, cm, cn, Schedule::schedule>::workspace_size},
  static const std::vector<KernelEntry> entries = {CUTE_MOE_KERNEL_TABLE(CUTE_MOE_REGISTRY_ENTRY)};
#undef CUTE_MOE_REGISTRY_ENTRY
  return entries;
}

}  // namespace cute_moe::detail
