// The runtime view of the dispatch table (kernel_table.inc, generated from
// codegen/kernel_space.py): one entry per compiled kernel, in table order. The
// KernelInstance members are defined in the generated translation units.
#include "kernel_registry.h"

#include "heuristics.h"
#include "kernel_table.inc"

#include <string>

namespace cute_moe::detail {

const std::vector<KernelEntry>& kernel_registry() {
#define CUTE_MOE_REGISTRY_ENTRY(arch, variant, tm, tn, tk, cm, cn, schedule, act, role)                      \
  {TileConfig{KernelVariant::variant, tm, tn, tk, cm, cn, Schedule::schedule, Act::act, TileRole::role,       \
              Arch::arch},                                                                                  \
   tile_config_name(TileConfig{KernelVariant::variant, tm, tn, tk, cm, cn, Schedule::schedule}),              \
   &KernelInstance<Arch::arch, KernelVariant::variant, tm, tn, tk, cm, cn, Schedule::schedule,                \
                   Act::act>::launch,                                                                       \
   &KernelInstance<Arch::arch, KernelVariant::variant, tm, tn, tk, cm, cn, Schedule::schedule,                \
                   Act::act>::workspace_size},
  static const std::vector<KernelEntry> entries = {CUTE_MOE_KERNEL_TABLE(CUTE_MOE_REGISTRY_ENTRY)};
#undef CUTE_MOE_REGISTRY_ENTRY
  return entries;
}

int limit_free_kernel(const std::vector<KernelEntry>& registry, int index) {
  const TileConfig& c = registry[index].config;
  const Act twin = limit_free_twin(c.act);
  if (twin == Act::Unfused) return index;
  for (size_t i = 0; i < registry.size(); ++i) {
    const TileConfig& t = registry[i].config;
    if (t.act == twin && t.variant == c.variant && t.arch == c.arch && t.tile_m == c.tile_m && t.tile_n == c.tile_n &&
        t.tile_k == c.tile_k && t.cluster_m == c.cluster_m && t.cluster_n == c.cluster_n && t.schedule == c.schedule) {
      return static_cast<int>(i);
    }
  }
  return index;
}

Result kernel_arch_for(const DeviceInfo& d, Arch* arch) {
  for (const auto& e : kernel_registry()) {
    if (arch_major(e.config.arch) == d.cc_major && arch_minor(e.config.arch) == d.cc_minor) {
      *arch = e.config.arch;
      return Result::success();
    }
  }
  return Result::error(Status::kNotSupported, std::string("cute_moe's kernels run on ") + compiled_arches() +
                                                  "; device " + std::to_string(d.device) + " has compute capability " +
                                                  std::to_string(d.cc_major) + "." + std::to_string(d.cc_minor));
}

}  // namespace cute_moe::detail
