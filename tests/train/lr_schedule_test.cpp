#include "memfit/train/lr_schedule.h"

#include <gtest/gtest.h>

#include "memfit/core/error.h"
#include "memfit/train/grad_clip.h"
#include "memfit/train/progress.h"

namespace memfit {
namespace {

// Warmup 10 from lr/10 up, then 99 decay steps (steps 10..109) from 1e-3 to 1e-4. The values a
// third and two thirds of the way are the cosine's, 1e-4 + 9e-4 * (1 + cos(pi/3 or 2pi/3)) / 2
// = 7.75e-4 and 3.25e-4, where a linear decay would give 7e-4 and 4e-4.
TEST(LrSchedule, WarmsUpThenFollowsACosineToTheFloor) {
  LrSchedule s{"cosine", 1e-3f, 1e-4f, 10, 110};
  EXPECT_FLOAT_EQ(s.at(0), 1e-4f);
  EXPECT_FLOAT_EQ(s.at(4), 5e-4f);
  EXPECT_FLOAT_EQ(s.at(9), 1e-3f);
  EXPECT_FLOAT_EQ(s.at(10), 1e-3f);
  EXPECT_FLOAT_EQ(s.at(10 + 33), 7.75e-4f);
  EXPECT_FLOAT_EQ(s.at(10 + 66), 3.25e-4f);
  EXPECT_FLOAT_EQ(s.at(109), 1e-4f);
  EXPECT_FLOAT_EQ(s.at(500), 1e-4f);
  for (int64_t i = 11; i < 110; ++i) EXPECT_LT(s.at(i), s.at(i - 1));
}

TEST(LrSchedule, ConstantAfterWarmup) {
  LrSchedule s{"constant", 2e-3f, 0.0f, 0, 50};
  EXPECT_FLOAT_EQ(s.at(0), 2e-3f);
  EXPECT_FLOAT_EQ(s.at(49), 2e-3f);
}

TEST(LrSchedule, BadSettingsAreConfigErrors) {
  EXPECT_THROW((LrSchedule{"linear", 1e-3f, 0.0f, 0, 10}.validate()), ConfigError);
  EXPECT_THROW((LrSchedule{"cosine", 1e-3f, 2e-3f, 0, 10}.validate()), ConfigError);
  EXPECT_THROW((LrSchedule{"cosine", 1e-3f, 0.0f, -1, 10}.validate()), ConfigError);
}

TEST(GradClip, FactorMatchesTorch) {
  EXPECT_FLOAT_EQ(clip_factor(2.0, 1.0f), static_cast<float>(1.0 / (2.0 + 1e-6)));
  EXPECT_FLOAT_EQ(clip_factor(0.5, 1.0f), 1.0f);
  EXPECT_FLOAT_EQ(clip_factor(100.0, 0.0f), 1.0f);
}

TEST(Progress, FormatsDurations) {
  EXPECT_EQ(Progress::format_duration(65), "01:05");
  EXPECT_EQ(Progress::format_duration(3725), "1:02:05");
  EXPECT_EQ(Progress::format_duration(-1), "--:--");
}

}  // namespace
}  // namespace memfit
