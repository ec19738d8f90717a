// Shared by the tests of the pages (memory.html, curves.html): a page's data block parsed back,
// and Debian's headless Chromium (scripts/test.sh installs it; the browser tests skip and say why
// where it is absent) opening a page, the DOM its script built read back, or a screenshot saved.
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace memfit::test {

inline std::string slurp_bytes(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

inline size_t count_of(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = 0; (at = text.find(what, at)) != std::string::npos; at += what.size()) ++n;
  return n;
}

// The page's data block (<script id="data" type="application/json">), parsed back.
inline nlohmann::json page_data_block(const std::string& html) {
  const std::string open = R"(<script id="data" type="application/json">)";
  const size_t a = html.find(open);
  EXPECT_NE(a, std::string::npos);
  if (a == std::string::npos) return nullptr;
  const size_t b = html.find("</script>", a);
  return nlohmann::json::parse(html.substr(a + open.size(), b - a - open.size()));
}

// Chromium on this machine: $MEMFIT_CHROMIUM, else chromium or chromium-browser on the PATH;
// empty where there is none.
inline std::string chromium() {
  if (const char* env = std::getenv("MEMFIT_CHROMIUM"); env && *env) return env;
  for (const char* name : {"chromium", "chromium-browser"})
    if (std::system(fmt::format("command -v {} > /dev/null 2>&1", name).c_str()) == 0) return name;
  return {};
}

inline constexpr const char* kNoChromium =
    "chromium is not installed (scripts/test.sh installs Debian's chromium; MEMFIT_CHROMIUM "
    "names another)";

// Runs headless Chromium on `page` with `what` (--dump-dom, --screenshot=...); stdout to `out`,
// stderr to `err`. Returns the exit code.
inline int run_chromium(const std::string& browser, const std::filesystem::path& page,
                        const std::string& what, const std::filesystem::path& out,
                        const std::filesystem::path& err, const std::filesystem::path& profile) {
  const std::string cmd = fmt::format(
      "timeout 120 {} --headless --no-sandbox --disable-gpu --disable-quic --no-first-run "
      "--disable-background-networking --disable-component-update --disable-sync "
      "--user-data-dir='{}' --window-size=1200,700 --virtual-time-budget=10000 {} 'file://{}' "
      "> '{}' 2> '{}'",
      browser, profile.string(), what, std::filesystem::absolute(page).string(), out.string(),
      err.string());
  const int status = std::system(cmd.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// The page's script ran to its end (it sets data-ready on <body>) without an error (the page's
// error handler sets data-error on <html> and writes into <pre id="errors">), and Chromium
// reported none. `dom` is --dump-dom's output, `err` Chromium's stderr.
inline void expect_drawn_without_error(const std::string& dom, const std::string& err) {
  EXPECT_NE(dom.find(R"(data-ready="1")"), std::string::npos) << "the script did not finish\n" << err;
  const size_t html = dom.find("<html");
  ASSERT_NE(html, std::string::npos);
  const std::string html_tag = dom.substr(html, dom.find('>', html) - html);
  EXPECT_EQ(html_tag.find("data-error"), std::string::npos) << dom.substr(0, 2000);
  EXPECT_NE(dom.find(R"(<pre id="errors"></pre>)"), std::string::npos);
  for (const char* bad : {"Uncaught", "SyntaxError", "TypeError", "ReferenceError"})
    EXPECT_EQ(err.find(bad), std::string::npos) << err;
}

}  // namespace memfit::test
