#include "memfit/cli/version.h"

#include <oneapi/dnnl/dnnl.h>

#include <hwy/highway.h>

#include <fmt/format.h>

#include "memfit/cli/git_commit.h"
#include "memfit/core/cpu.h"
#include "memfit/kernels/cpu/simd.h"

namespace memfit::cli {

namespace {

std::string compiler() {
#if defined(__clang__)
  return fmt::format("clang {}.{}.{}", __clang_major__, __clang_minor__, __clang_patchlevel__);
#elif defined(__GNUC__)
  return fmt::format("GCC {}.{}.{}", __GNUC__, __GNUC_MINOR__, __GNUC_PATCHLEVEL__);
#else
  return "unknown";
#endif
}

}  // namespace

std::string version_text() {
  const dnnl_version_t* dnnl = dnnl_version();
  const std::string cap =
      cpu::capped() ? fmt::format(", capped to {} by MEMFIT_MAX_ISA", cpu::isa_name(cpu::max_isa()))
                    : std::string();
  return fmt::format(
      "memfit {} (commit {})\n"
      "compiler: {}, C++{}\n"
      "oneDNN: {}.{}.{} (commit {})\n"
      "Highway: {}.{}.{}\n"
      "CPU: {}: {}{}; kernels' dispatch target {}",
      MEMFIT_VERSION, kGitCommit, compiler(), __cplusplus / 100 % 100, dnnl->major, dnnl->minor,
      dnnl->patch, dnnl->hash, HWY_MAJOR, HWY_MINOR, HWY_PATCH, cpu::model_name(),
      cpu::isa_name(cpu::detected_isa()), cap, kernels::simd_target());
}

}  // namespace memfit::cli
