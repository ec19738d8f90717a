// memory.html: one self-contained page (nothing fetched, no external reference, a small file)
// whose data block holds what it draws; and, opened in headless Chromium (Debian's `chromium`,
// which scripts/test.sh installs; the browser tests skip with a message where it is absent), it
// runs without a JavaScript error, draws one area per category and the peak, and a screenshot
// of it is saved under the build directory (test-artifacts/).
#include "memfit/profile/memory_page.h"

#include <gtest/gtest.h>
#include <filesystem>

#include "../train/trainer_fixture.h"
#include "page_test_util.h"
#include "memfit/cli/options/train_from_config.h"

namespace memfit {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

using test::chromium;
using test::run_chromium;

std::string slurp(const fs::path& p) { return test::slurp_bytes(p); }
size_t count(const std::string& text, const std::string& what) { return test::count_of(text, what); }

json page_json(const std::string& html) { return test::page_data_block(html); }

class MemoryPage : public test::TrainerFixture, public ::testing::WithParamInterface<const char*> {
 protected:
  // A short run of the model with --profile: its page and its summary.
  fs::path profile_run() {
    TrainConfig c = config(GetParam());
    c.steps = 2;
    c.profile_dir = (dir / "profile").string();
    c.profile_steps = 2;
    train(c);
    return dir / "profile";
  }
};

TEST_P(MemoryPage, IsOneSmallSelfContainedFile) {
  const fs::path p = profile_run();
  const std::string html = slurp(p / "memory.html");
  EXPECT_LT(html.size(), 300u * 1024);
  for (const char* ref : {" src=", " href=", "@import", "url(http", "fetch(", "XMLHttpRequest"})
    EXPECT_EQ(html.find(ref), std::string::npos) << ref;
  const json data = page_json(html);
  const json summary = json::parse(slurp(p / "summary.json"));
  EXPECT_EQ(data["pool_peak"], summary["measured"]["peak_bytes"]);
  EXPECT_EQ(data["peak"]["bytes"], summary["live_peak"]["bytes"]);
  EXPECT_EQ(data["t"].size(), data["pool_total"].size());
  for (const auto& [category, values] : data["live"].items())
    EXPECT_EQ(values.size(), data["t"].size()) << category;
  EXPECT_FALSE(data["planned"].is_null());
  EXPECT_FALSE(data["runs"].empty());
}

TEST_P(MemoryPage, DrawsInHeadlessChromiumWithoutAnError) {
  const std::string browser = chromium();
  if (browser.empty()) GTEST_SKIP() << test::kNoChromium;
  const fs::path p = profile_run();
  const json data = page_json(slurp(p / "memory.html"));
  ASSERT_EQ(run_chromium(browser, p / "memory.html", "--dump-dom", dir / "dom.html",
                         dir / "dom.err", dir / "chromium"),
            0)
      << slurp(dir / "dom.err");
  const std::string dom = slurp(dir / "dom.html"), err = slurp(dir / "dom.err");
  test::expect_drawn_without_error(dom, err);
  // One area per category, the arenas' unused bytes, the peak and the plan.
  EXPECT_EQ(count(dom, R"(class="area")"), data["categories"].size());
  for (const auto& c : data["categories"])
    EXPECT_NE(dom.find(fmt::format(R"(data-category="{}")", c.get<std::string>())), std::string::npos) << c;
  EXPECT_EQ(count(dom, R"(class="slack")"), 1u);
  EXPECT_NE(dom.find(R"(id="peak-marker")"), std::string::npos);
  EXPECT_NE(dom.find(R"(id="planned-peak")"), std::string::npos);
  EXPECT_NE(dom.find("peak " ), std::string::npos);

  const fs::path shots = fs::path(MEMFIT_BINARY_DIR) / "test-artifacts";
  fs::create_directories(shots);
  const fs::path png = shots / fmt::format("memory_page_{}.png", GetParam());
  fs::remove(png);
  ASSERT_EQ(run_chromium(browser, p / "memory.html", "--screenshot=" + png.string(),
                         dir / "shot.out", dir / "shot.err", dir / "chromium"),
            0)
      << slurp(dir / "shot.err");
  const std::string image = slurp(png);
  ASSERT_GT(image.size(), 10000u) << png;
  EXPECT_EQ(image.substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8));
}

INSTANTIATE_TEST_SUITE_P(Families, MemoryPage, ::testing::Values("gpt2-tiny", "llama-tiny"),
                         [](const auto& info) {
                           std::string s = info.param;
                           for (char& ch : s) if (ch == '-') ch = '_';
                           return s;
                         });

}  // namespace
}  // namespace memfit
