// trainer_state.json as a resume reads it: where the run stands, the settings it must share, and
// an IoError or ConfigError (never another exception) for anything else. fuzz/trainer_state_fuzz
// feeds it arbitrary bytes; these are the cases by name.
#include "memfit/train/resume_state.h"

#include <gtest/gtest.h>

#include <string>

#include <nlohmann/json.hpp>

#include "memfit/core/error.h"
#include "memfit/train/lr_schedule.h"

namespace memfit {
namespace {

using nlohmann::json;

// The settings of the run that resumes, as it records them in its own trainer_state.json
// (TrainRun::run_state_json): the run that saved.
json run_settings() {
  return {{"seed", 1337},         {"batch", 4},          {"grad_accum", 1},
          {"seq_len", 64},        {"steps", 30},         {"shuffle", true},
          {"optim", "adamw"},     {"attention", "flash"}, {"precision", "fp32"},
          {"optim_state_dtype", "f32"},
          {"act_compress", "none"}, {"master_weights", "fp32"},
          {"schedule", LrSchedule{.total = 30}.to_json()}};
}

json saved_state() {
  json s = run_settings();
  s.erase("act_compress");  // saved before the field existed: none
  s.erase("schedule");
  s["step"] = 10;
  s["data_position"] = 40;
  return s;
}

ResumeState parse(const json& j) {
  return parse_trainer_state(j.dump(), run_settings(), "ck/trainer_state.json");
}

TEST(ResumeState, AValidStateGivesTheStepAndDataPosition) {
  const ResumeState r = parse(saved_state());
  EXPECT_EQ(r.step, 10);
  EXPECT_EQ(r.data_position, 40);
  EXPECT_EQ(r.state["optim"], "adamw");
}

TEST(ResumeState, OlderStatesWithoutPrecisionAreFp32) {
  json j = saved_state();
  j.erase("precision");
  j.erase("master_weights");
  EXPECT_EQ(parse(j).step, 10);
}

TEST(ResumeState, OptimizerStateDtypeMustMatchAndOlderStatesHadF32) {
  json j = saved_state();
  j.erase("optim_state_dtype");  // saved before it existed: f32
  json c = run_settings();
  EXPECT_EQ(parse_trainer_state(j.dump(), c, "f").step, 10);
  c["optim_state_dtype"] = "bf16";
  try {
    parse_trainer_state(j.dump(), c, "f");
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("--optim-state-dtype"), std::string::npos) << e.what();
  }
  j["optim_state_dtype"] = "bf16";
  EXPECT_EQ(parse_trainer_state(j.dump(), c, "f").step, 10);
}

TEST(ResumeState, ActivationCompressionMustMatchAndOlderStatesHadNone) {
  json j = saved_state();  // no "act_compress": saved before it existed
  json c = run_settings();  // act_compress none
  EXPECT_EQ(parse_trainer_state(j.dump(), c, "f").step, 10);
  c["act_compress"] = "int8";
  EXPECT_THROW(parse_trainer_state(j.dump(), c, "f"), ConfigError);
  j["act_compress"] = "int8";
  EXPECT_EQ(parse_trainer_state(j.dump(), c, "f").step, 10);
  c["act_compress"] = "fp8";
  try {
    parse_trainer_state(j.dump(), c, "ck/trainer_state.json");
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("act_compress = \"int8\""), std::string::npos) << what;
    EXPECT_NE(what.find("fp8"), std::string::npos) << what;
    EXPECT_NE(what.find("ck/trainer_state.json"), std::string::npos) << what;
  }
  j["act_compress"] = 3;  // not a name: still the setting that differs, by name
  EXPECT_THROW(parse_trainer_state(j.dump(), c, "f"), ConfigError);
}

TEST(ResumeState, AnotherSettingIsAConfigErrorNamingIt) {
  json j = saved_state();
  j["batch"] = 8;
  try {
    parse(j);
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("batch = 8"), std::string::npos) << e.what();
  }
}

// More --steps than the checkpoint's train on (Note [Training longer]): the saved length is
// kept apart from the schedule's changes, which no longer list it; fewer are refused.
TEST(ResumeState, MoreStepsTrainLongerAndFewerAreRefused) {
  json j = saved_state();
  json c = run_settings();
  LrSchedule schedule{.total = 30};
  j["schedule"] = schedule.to_json();
  EXPECT_EQ(longer_run_note(parse_trainer_state(j.dump(), c, "f"), c), "");
  c["steps"] = 50;
  schedule.total = 50;
  c["schedule"] = schedule.to_json();
  const ResumeState r = parse_trainer_state(j.dump(), c, "f");
  EXPECT_EQ(r.steps, 30);
  EXPECT_EQ(schedule_changes(r, c), "");
  const std::string note = longer_run_note(r, c);
  EXPECT_NE(note.find("from step 10 of a 30-step run to 50 steps"), std::string::npos) << note;
  EXPECT_NE(note.find("stretched"), std::string::npos) << note;
  EXPECT_NE(note.find("not bit-identical"), std::string::npos) << note;
  schedule.lr = 1e-4f;  // a rate change is still said
  c["schedule"] = schedule.to_json();
  EXPECT_NE(schedule_changes(r, c).find("lr 0.0006 -> 0.0001"), std::string::npos);
  c["steps"] = 20;
  try {
    parse_trainer_state(j.dump(), c, "f");
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("steps = 30, this run has 20"), std::string::npos)
        << e.what();
  }
}

TEST(ResumeState, BadFilesAreIoErrors) {
  EXPECT_THROW(parse_trainer_state("{\"step\": ", run_settings(), "f"), IoError);
  EXPECT_THROW(parse(json::array()), IoError);
  for (const char* key : {"step", "data_position", "batch"}) {
    json j = saved_state();
    j.erase(key);
    EXPECT_THROW(parse(j), IoError) << key;
  }
  // Counts of the wrong type or sign: nlohmann would throw its own type_error, or wrap.
  for (const json& bad : {json("10"), json(-1), json(2.5), json(18446744073709551615ull)}) {
    json j = saved_state();
    j["step"] = bad;
    EXPECT_THROW(parse(j), IoError) << bad.dump();
  }
}

}  // namespace
}  // namespace memfit
