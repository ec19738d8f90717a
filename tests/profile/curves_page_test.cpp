// curves.html: a training log read into the page's series (steps sorted, validation losses
// apart, other lines skipped, a null kept as a gap), each run's name and each series in the
// page, which is one self-contained file; a real `train --log` read back whole; bad input a
// ConfigError naming the file and the line; and, in headless Chromium (skipped where absent), a
// line per run and series, a stacked area per run and category, no JavaScript error, and a
// screenshot under the build directory (test-artifacts/).
#include "memfit/profile/curves_page.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "../train/trainer_fixture.h"
#include "memfit/cli/options/train_from_config.h"
#include "memfit/core/error.h"
#include "page_test_util.h"

namespace memfit {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

class CurvesPage : public test::TrainerFixture {
 protected:
  // A log as memfit train writes it: `steps` step lines with a falling loss (lr, grad_norm,
  // tokens_per_s, memory by category), a validation line every 5 steps, a save line, a ZeRO
  // line; `scale` sets the run apart from another.
  fs::path write_log(const std::string& name, int steps, double scale) const {
    const fs::path file = dir / (name + ".jsonl");
    std::ofstream out(file);
    for (int s = 1; s <= steps; ++s) {
      json mem = {{"params", 1000000}, {"grads", 1000000}, {"optimizer", 2000000},
                  {"activations", 500000 + 1000 * s}};
      if (s > 2) mem["workspace"] = 4096;
      out << json{{"step", s},
                  {"loss", scale * (10.0 - 0.2 * s)},
                  {"lr", 1e-3 * std::min(1.0, s / 4.0)},
                  {"grad_norm", s == 3 ? json(nullptr) : json(2.0 / s)},
                  {"tokens_per_s", 1000.0 * scale + s},
                  {"step_seconds", 0.5},
                  {"peak_bytes", 5000000 + 1000 * s},
                  {"mem", mem},
                  {"rss_bytes", 9000000}}
                 .dump()
          << '\n';
      if (s % 5 == 0) out << json{{"step", s}, {"val_loss", scale * (10.1 - 0.2 * s)}}.dump() << '\n';
    }
    out << json{{"step", steps}, {"saved", "out/x"}, {"mem", json::object()}}.dump() << "\n\n";
    out << json{{"zero", 1}, {"ranks", json::array()}}.dump() << '\n';
    return file;
  }

  // Writes `lines` as a log and returns the error reading it gives.
  std::string error_of(const std::string& lines) const {
    const fs::path file = dir / "bad.jsonl";
    std::ofstream(file) << lines;
    try {
      profile::read_training_log(file, "bad");
    } catch (const ConfigError& e) {
      return e.what();
    }
    ADD_FAILURE() << "no ConfigError for:\n" << lines;
    return {};
  }
};

TEST_F(CurvesPage, ReadsEverySeriesOfTheLog) {
  const json run = profile::read_training_log(write_log("a", 12, 1.0), "a");
  EXPECT_EQ(run["name"], "a");
  EXPECT_EQ(run["step"].size(), 12u);
  EXPECT_EQ(run["step"][11], 12);
  EXPECT_DOUBLE_EQ(run["loss"][0].get<double>(), 9.8);
  EXPECT_DOUBLE_EQ(run["lr"][1].get<double>(), 5e-4);
  EXPECT_TRUE(run["grad_norm"][2].is_null());  // a skipped step's norm: a gap
  EXPECT_DOUBLE_EQ(run["grad_norm"][3].get<double>(), 0.5);
  EXPECT_DOUBLE_EQ(run["tokens_per_s"][4].get<double>(), 1005.0);
  EXPECT_EQ(run["peak_bytes"][0], 5001000);
  EXPECT_EQ(run["rss_bytes"][0], 9000000);
  EXPECT_EQ(run["val_step"], json::array({5, 10}));
  EXPECT_DOUBLE_EQ(run["val_loss"][1].get<double>(), 8.1);
  // Categories in the pool's order; a category a step lacks is 0 there.
  EXPECT_EQ(run["categories"],
            json::array({"params", "grads", "optimizer", "activations", "workspace"}));
  EXPECT_EQ(run["mem"]["workspace"][1], 0);
  EXPECT_EQ(run["mem"]["workspace"][2], 4096);
  EXPECT_EQ(run["mem"]["activations"][11], 512000);
}

TEST_F(CurvesPage, StepsAreSortedAndALaterLineWins) {
  const fs::path file = dir / "r.jsonl";
  std::ofstream(file) << R"({"step": 2, "loss": 5.0})" << '\n'
                      << R"({"step": 1, "loss": 6.0})" << '\n'
                      << R"({"step": 2, "loss": 4.0})" << '\n';
  const json run = profile::read_training_log(file, "r");
  EXPECT_EQ(run["step"], json::array({1, 2}));
  EXPECT_EQ(run["loss"], json::array({6.0, 4.0}));
  EXPECT_TRUE(run["lr"][0].is_null());
  EXPECT_TRUE(run["categories"].empty());
}

TEST_F(CurvesPage, CarriesEachRunsNameAndEverySeries) {
  const fs::path a = write_log("baseline", 10, 1.0), b = write_log("ckpt-full", 7, 1.1);
  const json data = profile::curves_data({a.string(), b.string()});
  const std::string html = profile::curves_page_html(data);
  EXPECT_NE(html.find("<title>memfit training curves: baseline and ckpt-full</title>"),
            std::string::npos);
  const json block = test::page_data_block(html);
  ASSERT_EQ(block["runs"].size(), 2u);
  EXPECT_EQ(block["runs"][0]["name"], "baseline");
  EXPECT_EQ(block["runs"][1]["name"], "ckpt-full");
  EXPECT_EQ(block["runs"][1]["path"], b.string());
  for (const json& run : block["runs"])
    for (const char* series : {"step", "loss", "lr", "grad_norm", "tokens_per_s", "peak_bytes",
                               "rss_bytes"})
      EXPECT_EQ(run[series].size(), run["step"].size()) << series;
  EXPECT_EQ(block["runs"][1]["val_loss"].size(), 1u);
  EXPECT_EQ(block["runs"][1]["mem"]["optimizer"].size(), 7u);
  // One small file that fetches nothing.
  EXPECT_LT(html.size(), 100u * 1024);
  for (const char* ref : {" src=", " href=", "@import", "url(http", "fetch(", "XMLHttpRequest"})
    EXPECT_EQ(html.find(ref), std::string::npos) << ref;
  // A name cannot end the data block early, nor a title open a tag.
  json odd = data;
  odd["title"] = "<b>bold</b>";
  odd["runs"][0]["name"] = "a</script><b>";
  const std::string odd_html = profile::curves_page_html(odd);
  EXPECT_EQ(test::page_data_block(odd_html)["runs"][0]["name"], "a</script><b>");
  EXPECT_EQ(odd_html.find("a</script>"), std::string::npos);
  EXPECT_NE(odd_html.find("<title>&lt;b&gt;bold&lt;/b&gt;</title>"), std::string::npos);
}

TEST_F(CurvesPage, NamesRunsByTheirFileUnlessTwoShareOne) {
  EXPECT_EQ(profile::run_names({"out/a.jsonl", "x/b.jsonl"}),
            (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(profile::run_names({"one/run.jsonl", "two/run.jsonl", "c.jsonl"}),
            (std::vector<std::string>{"one/run.jsonl", "two/run.jsonl", "c"}));
  EXPECT_EQ(profile::curves_path_for_log("out/brown.jsonl"), fs::path("out/brown.curves.html"));
  EXPECT_EQ(profile::curves_path_for_log("log"), fs::path("log.curves.html"));
}

TEST_F(CurvesPage, ReadsWhatTheTrainerLogs) {
  TrainConfig c = config();
  c.log_file = (dir / "run.jsonl").string();
  c.save_dir = (dir / "save").string();
  c.save_every = 2;
  train(c);
  const json run = profile::read_training_log(c.log_file, "run");
  EXPECT_EQ(run["step"], json::array({1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(run["val_step"], json::array({3, 6}));
  for (const char* series : {"loss", "lr", "grad_norm", "tokens_per_s", "peak_bytes", "rss_bytes"})
    for (const json& v : run[series]) EXPECT_TRUE(v.is_number()) << series << ": " << v;
  EXPECT_GT(run["loss"][0].get<double>(), run["loss"][5].get<double>());
  for (const char* category : {"params", "grads", "optimizer"})
    EXPECT_GT(run["mem"][category][5].get<int64_t>(), 0) << category;
  const fs::path page = dir / "run.curves.html";
  profile::write_curves_page({c.log_file}, page);
  EXPECT_EQ(test::page_data_block(test::slurp_bytes(page))["runs"][0]["step"].size(), 6u);
}

TEST_F(CurvesPage, BadInputNamesTheFileAndTheLine) {
  const std::string file = (dir / "bad.jsonl").string();
  const std::string good = R"({"step": 1, "loss": 5.0})" "\n";
  std::string e = error_of(good + "\n{\"step\": 2, \"loss\": 4.\n");
  EXPECT_NE(e.find("[curves] " + file + ":3: not valid JSON"), std::string::npos) << e;
  e = error_of(good + "[1, 2]\n");
  EXPECT_NE(e.find(file + ":2: a line must be a JSON object, got [1,2]"), std::string::npos) << e;
  e = error_of(good + R"({"step": 2, "loss": "low"})" "\n");
  EXPECT_NE(e.find(file + R"(:2: "loss" must be a number, got "low")"), std::string::npos) << e;
  e = error_of(R"({"loss": 5.0})" "\n");
  EXPECT_NE(e.find(file + R"(:1: a line with "loss" has no "step")"), std::string::npos) << e;
  e = error_of(good + R"({"step": 0, "val_loss": 5.0})" "\n");
  EXPECT_NE(e.find(file + R"(:2: "step" must be an integer of 1 or more, got 0)"),
            std::string::npos) << e;
  e = error_of(good + R"({"step": 2, "loss": 4.0, "mem": {"params": -1}})" "\n");
  EXPECT_NE(e.find(file + R"(:2: "mem"."params" must be a byte count, got -1)"),
            std::string::npos) << e;
  e = error_of(R"({"step": 1, "saved": "x"})" "\n");
  EXPECT_NE(e.find(file + ": no training steps"), std::string::npos) << e;
  EXPECT_THROW(profile::read_training_log(dir / "absent.jsonl", "absent"), IoError);
  EXPECT_THROW(profile::curves_data({}), Error);
}

TEST_F(CurvesPage, DrawsInHeadlessChromiumWithoutAnError) {
  const std::string browser = test::chromium();
  if (browser.empty()) GTEST_SKIP() << test::kNoChromium;
  // Two runs, and a third of a single step (no line to draw, a bar for its memory).
  const fs::path a = write_log("baseline", 30, 1.0), b = write_log("smaller-lr", 20, 1.1),
                 c = write_log("one-step", 1, 1.2);
  const fs::path page = dir / "cmp.html";
  profile::write_curves_page({a.string(), b.string(), c.string()}, page);
  ASSERT_EQ(test::run_chromium(browser, page, "--dump-dom", dir / "dom.html", dir / "dom.err",
                               dir / "chromium"),
            0)
      << test::slurp_bytes(dir / "dom.err");
  const std::string dom = test::slurp_bytes(dir / "dom.html");
  test::expect_drawn_without_error(dom, test::slurp_bytes(dir / "dom.err"));
  // Each series once per run, the validation loss of the runs that have one, each run's memory
  // stacked by category with its peak and resident lines, and each run's name in the legend.
  for (const char* series : {"loss", "lr", "grad_norm", "tokens_per_s", "val_loss",
                             "peak_bytes", "rss_bytes"})
    EXPECT_EQ(test::count_of(dom, fmt::format(R"(data-series="{}")", series)), 3u) << series;
  EXPECT_EQ(test::count_of(dom, R"(class="val-point")"), 6u + 4u);
  for (int run = 0; run < 3; ++run) {
    for (const char* category : {"params", "grads", "optimizer", "activations"})
      EXPECT_NE(dom.find(fmt::format(R"(data-run="{}" data-category="{}")", run, category)),
                std::string::npos) << run << " " << category;
    EXPECT_NE(dom.find(fmt::format(R"(id="panel-memory-{}")", run)), std::string::npos) << run;
  }
  EXPECT_EQ(test::count_of(dom, R"(class="area")"), 5u + 5u + 4u);
  for (const char* name : {"baseline", "smaller-lr", "one-step"})
    EXPECT_NE(dom.find(fmt::format("</span>{}</span>", name)), std::string::npos) << name;
  // Lines were drawn, not empty paths: the first run's loss has a point per step.
  const size_t loss = dom.find(R"(data-run="0" data-series="loss")");
  ASSERT_NE(loss, std::string::npos);
  const size_t d = dom.rfind(" d=\"M", loss);
  ASSERT_NE(d, std::string::npos);
  EXPECT_EQ(test::count_of(dom.substr(d, loss - d), "L"), 29u);

  const fs::path shots = fs::path(MEMFIT_BINARY_DIR) / "test-artifacts";
  fs::create_directories(shots);
  const fs::path png = shots / "curves_page.png";
  fs::remove(png);
  ASSERT_EQ(test::run_chromium(browser, page, "--screenshot=" + png.string(), dir / "shot.out",
                               dir / "shot.err", dir / "chromium"),
            0)
      << test::slurp_bytes(dir / "shot.err");
  const std::string image = test::slurp_bytes(png);
  ASSERT_GT(image.size(), 10000u) << png;
  EXPECT_EQ(image.substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8));
}

}  // namespace
}  // namespace memfit
