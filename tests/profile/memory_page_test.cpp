// memory.html: one self-contained page (nothing fetched, no external reference, a small file)
// whose data block holds what it draws; and, opened in headless Chromium (Debian's `chromium`,
// which scripts/test.sh installs; the browser tests skip with a message where it is absent), it
// runs without a JavaScript error, draws one area per category and the peak, and a screenshot
// of it is saved under the build directory (test-artifacts/).
#include "memfit/profile/memory_page.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "../train/trainer_fixture.h"
#include "memfit/train/trainer.h"

namespace memfit {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = 0; (at = text.find(what, at)) != std::string::npos; at += what.size()) ++n;
  return n;
}

// The page's data block, parsed back.
json page_json(const std::string& html) {
  const std::string open = R"(<script id="data" type="application/json">)";
  const size_t a = html.find(open), b = html.find("</script>", a);
  EXPECT_NE(a, std::string::npos);
  return json::parse(html.substr(a + open.size(), b - a - open.size()));
}

// Chromium on this machine: $MEMFIT_CHROMIUM, else chromium or chromium-browser on the PATH.
std::string chromium() {
  if (const char* env = std::getenv("MEMFIT_CHROMIUM"); env && *env) return env;
  for (const char* name : {"chromium", "chromium-browser"})
    if (std::system(fmt::format("command -v {} > /dev/null 2>&1", name).c_str()) == 0) return name;
  return {};
}

// Runs headless Chromium on `page` with `what` (--dump-dom, --screenshot=...); stdout to `out`,
// stderr to `err`. Returns the exit code.
int run_chromium(const std::string& browser, const fs::path& page, const std::string& what,
                 const fs::path& out, const fs::path& err, const fs::path& profile) {
  const std::string cmd = fmt::format(
      "timeout 120 {} --headless --no-sandbox --disable-gpu --disable-quic --no-first-run "
      "--disable-background-networking --disable-component-update --disable-sync "
      "--user-data-dir='{}' --window-size=1200,700 --virtual-time-budget=10000 {} 'file://{}' "
      "> '{}' 2> '{}'",
      browser, profile.string(), what, fs::absolute(page).string(), out.string(), err.string());
  const int status = std::system(cmd.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

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
  if (browser.empty())
    GTEST_SKIP() << "chromium is not installed (scripts/test.sh installs Debian's chromium; "
                    "MEMFIT_CHROMIUM names another)";
  const fs::path p = profile_run();
  const json data = page_json(slurp(p / "memory.html"));
  ASSERT_EQ(run_chromium(browser, p / "memory.html", "--dump-dom", dir / "dom.html",
                         dir / "dom.err", dir / "chromium"),
            0)
      << slurp(dir / "dom.err");
  const std::string dom = slurp(dir / "dom.html"), err = slurp(dir / "dom.err");
  EXPECT_NE(dom.find(R"(data-ready="1")"), std::string::npos) << "the script did not finish\n" << err;
  const size_t html = dom.find("<html");
  ASSERT_NE(html, std::string::npos);
  const std::string html_tag = dom.substr(html, dom.find('>', html) - html);
  EXPECT_EQ(html_tag.find("data-error"), std::string::npos) << dom.substr(0, 2000);
  EXPECT_NE(dom.find(R"(<pre id="errors"></pre>)"), std::string::npos);
  for (const char* bad : {"Uncaught", "SyntaxError", "TypeError", "ReferenceError"})
    EXPECT_EQ(err.find(bad), std::string::npos) << err;
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
