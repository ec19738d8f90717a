// The dynamic loss scaler's state machine: growth after a window of clean steps (capped),
// backoff with hysteresis as DeepSpeed and Megatron count it (and the consecutive variant),
// the floor, skips, the JSON state round trip and the config checks.
#include "memfit/train/loss_scaler.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "memfit/core/error.h"

namespace memfit {
namespace {

LossScalerConfig small_window(int64_t window, int hysteresis) {
  LossScalerConfig c;
  c.window = window;
  c.hysteresis = hysteresis;
  return c;
}

TEST(LossScaler, DefaultsAreTwoToTheSixteenWindow1000Hysteresis2) {
  DynamicLossScaler s;
  EXPECT_EQ(s.scale(), 65536.0f);
  EXPECT_EQ(s.inv_scale(), 1.0f / 65536.0f);
  EXPECT_EQ(s.config().window, 1000);
  EXPECT_EQ(s.config().hysteresis, 2);
  EXPECT_EQ(s.config().min_scale, 1.0f);
  for (int i = 0; i < 999; ++i) ASSERT_FALSE(s.update(false));
  EXPECT_EQ(s.scale(), 65536.0f);
  EXPECT_FALSE(s.update(false));
  EXPECT_EQ(s.scale(), 131072.0f);  // the 1000th clean step doubles it
}

TEST(LossScaler, GrowsAfterEachWindowOfCleanStepsUpToTheCap) {
  LossScalerConfig c = small_window(3, 2);
  c.initial_scale = 4.0f;
  c.max_scale = 16.0f;
  DynamicLossScaler s(c);
  const float want[] = {4, 4, 8, 8, 8, 16, 16, 16, 16};  // after each clean step
  for (float w : want) {
    EXPECT_FALSE(s.update(false));
    EXPECT_EQ(s.scale(), w);
  }
}

TEST(LossScaler, OverflowSkipsAndResetsTheWindow) {
  DynamicLossScaler s(small_window(3, 2));
  s.update(false);
  s.update(false);
  EXPECT_TRUE(s.update(true));  // skipped; the first overflow is tolerated
  EXPECT_EQ(s.scale(), 65536.0f);
  EXPECT_EQ(s.clean_steps(), 0);
  s.update(false);
  s.update(false);
  EXPECT_EQ(s.scale(), 65536.0f);  // only two clean steps since the overflow
  s.update(false);
  EXPECT_EQ(s.scale(), 131072.0f);
  EXPECT_EQ(s.steps(), 6);
  EXPECT_EQ(s.skipped(), 1);
}

// hysteresis 2: the second overflow since the last growth halves the scale, even with clean
// steps between them, and so does every overflow after it until a growth restores the count.
TEST(LossScaler, HysteresisCountsOverflowsSinceTheLastGrowth) {
  DynamicLossScaler s(small_window(4, 2));
  EXPECT_TRUE(s.update(true));
  EXPECT_EQ(s.scale(), 65536.0f);
  EXPECT_EQ(s.hysteresis_left(), 1);
  s.update(false);
  EXPECT_TRUE(s.update(true));
  EXPECT_EQ(s.scale(), 32768.0f);
  EXPECT_TRUE(s.update(true));
  EXPECT_EQ(s.scale(), 16384.0f);
  for (int i = 0; i < 4; ++i) s.update(false);  // a growth restores the hysteresis
  EXPECT_EQ(s.scale(), 32768.0f);
  EXPECT_EQ(s.hysteresis_left(), 2);
  EXPECT_TRUE(s.update(true));
  EXPECT_EQ(s.scale(), 32768.0f);
}

TEST(LossScaler, ConsecutiveHysteresisNeedsOverflowsInARow) {
  LossScalerConfig c = small_window(100, 2);
  c.consecutive_hysteresis = true;
  DynamicLossScaler s(c);
  s.update(true);
  s.update(false);  // restores the hysteresis
  s.update(true);
  EXPECT_EQ(s.scale(), 65536.0f);
  s.update(true);  // two in a row
  EXPECT_EQ(s.scale(), 32768.0f);
}

TEST(LossScaler, HysteresisOneCutsOnEveryOverflowDownToTheFloor) {
  LossScalerConfig c = small_window(100, 1);
  c.initial_scale = 8.0f;
  c.min_scale = 2.0f;
  DynamicLossScaler s(c);
  const float want[] = {4, 2, 2, 2};
  for (float w : want) {
    EXPECT_TRUE(s.update(true));  // still skipped at the floor
    EXPECT_EQ(s.scale(), w);
  }
}

TEST(LossScaler, JsonStateRoundTripsAndContinuesIdentically) {
  DynamicLossScaler a(small_window(3, 2));
  const bool pattern[] = {false, true, false, false, true, true, false, false, false, false};
  for (bool o : pattern) a.update(o);
  const nlohmann::json j = a.to_json();
  EXPECT_EQ(j.at("config").at("window"), 3);
  DynamicLossScaler b(small_window(3, 2));
  b.load_json(nlohmann::json::parse(j.dump()));  // through text, as a checkpoint stores it
  EXPECT_EQ(b.to_json(), j);
  for (bool o : pattern) EXPECT_EQ(a.update(o), b.update(o));
  EXPECT_EQ(a.to_json(), b.to_json());
}

TEST(LossScaler, BadStateAndConfigAreConfigErrors) {
  DynamicLossScaler s;
  nlohmann::json j = s.to_json();
  j.erase("clean_steps");
  EXPECT_THROW(s.load_json(j), ConfigError);
  j = s.to_json();
  j["scale"] = -1.0;
  EXPECT_THROW(s.load_json(j), ConfigError);
  EXPECT_THROW(s.load_json(nlohmann::json::array()), ConfigError);
  j = s.to_json();
  j["clean_steps"] = 1e30;  // no int64_t holds it (fuzz/corpus/trainer_state/scaler_huge)
  EXPECT_THROW(s.load_json(j), ConfigError);
  j = s.to_json();
  j["steps"] = 2.5;
  EXPECT_THROW(s.load_json(j), ConfigError);
  for (auto tweak : std::initializer_list<void (*)(LossScalerConfig&)>{
           [](LossScalerConfig& c) { c.window = 0; }, [](LossScalerConfig& c) { c.hysteresis = 0; },
           [](LossScalerConfig& c) { c.min_scale = 0.0f; },
           [](LossScalerConfig& c) { c.initial_scale = 0.5f; },  // below min_scale 1
           [](LossScalerConfig& c) { c.growth_factor = 1.0f; },
           [](LossScalerConfig& c) { c.backoff_factor = 1.0f; },
           [](LossScalerConfig& c) { c.max_scale = INFINITY; }}) {
    LossScalerConfig c;
    tweak(c);
    EXPECT_THROW(DynamicLossScaler{c}, ConfigError);
  }
}

}  // namespace
}  // namespace memfit
