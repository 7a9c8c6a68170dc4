// The runtime view of kernel_table.h: one entry per compiled kernel, in table order.
// The KernelInstance members are defined in the generated translation units.
#include "kernel_registry.h"

#include "heuristics.h"
#include "kernel_table.h"

namespace cute_moe::detail {

const std::vector<KernelEntry>& kernel_registry() {
#define CUTE_MOE_REGISTRY_ENTRY(variant, tm, tn, tk, cm, cn, schedule, act)                                \
  {TileConfig{KernelVariant::variant, tm, tn, tk, cm, cn, Schedule::schedule, Act::act},                    \
   tile_config_name(TileConfig{KernelVariant::variant, tm, tn, tk, cm, cn, Schedule::schedule, Act::act}),  \
   &KernelInstance<KernelVariant::variant, tm, tn, tk, cm, cn, Schedule::schedule, Act::act>::launch,       \
   &KernelInstance<KernelVariant::variant, tm, tn, tk, cm, cn, Schedule::schedule, Act::act>::workspace_size},
  static const std::vector<KernelEntry> entries = {CUTE_MOE_KERNEL_TABLE(CUTE_MOE_REGISTRY_ENTRY)};
#undef CUTE_MOE_REGISTRY_ENTRY
  return entries;
}

}  // namespace cute_moe::detail
