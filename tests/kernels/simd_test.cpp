// The run-time dispatch: the Highway target chosen under the cap in effect (MEMFIT_MAX_ISA,
// which CI sets to avx2 for its second run), and that every target this CPU supports can be
// selected in-process with hwy::SetSupportedTargetsForTest.
#include "memfit/kernels/cpu/simd.h"

#include <gtest/gtest.h>
#include <hwy/highway.h>
#include <hwy/targets.h>

#include <string>

#include "memfit/core/cpu.h"

namespace memfit::kernels {
namespace {

TEST(Simd, TargetFollowsTheCap) {
  // With MEMFIT_NATIVE=ON Highway compiles only the targets at or above the build machine's,
  // and a cap below them cannot take effect.
  if ((HWY_TARGETS & HWY_AVX2) == 0 && cpu::max_isa() <= cpu::Isa::avx2)
    GTEST_SKIP() << "AVX2 code not compiled (-march=native build)";
  const std::string target(simd_target());
  switch (cpu::max_isa()) {
    case cpu::Isa::scalar:
      EXPECT_TRUE(target == "SCALAR" || target == "EMU128") << target;
      break;
    case cpu::Isa::avx2:
      EXPECT_EQ(target, "AVX2");
      break;
    default:  // avx512 and above
      EXPECT_TRUE(target == "AVX3" || target == "AVX3_DL") << target;
      break;
  }
}

TEST(Simd, EveryCompiledTargetIsSelectable) {
  simd_target();  // applies the cap before the targets are listed
  const auto targets = hwy::SupportedAndGeneratedTargets();
  ASSERT_FALSE(targets.empty());
  for (int64_t t : targets) {
    hwy::SetSupportedTargetsForTest(t);
    EXPECT_EQ(std::string(simd_target()), hwy::TargetName(t));
  }
  hwy::SetSupportedTargetsForTest(0);
}

}  // namespace
}  // namespace memfit::kernels
