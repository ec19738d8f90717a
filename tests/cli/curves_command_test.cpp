// The training curves through the memfit binary: `train --log FILE` writes FILE's curves page
// beside it and prints its path; `memfit curves A B -o F` overlays two runs (and with one log and
// no -o writes beside it); a bad log exits 2 naming the file and the line, a missing one exits 2.
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include <fmt/format.h>

#include "cli_test_util.h"

namespace memfit {
namespace {

namespace fs = std::filesystem;

class CurvesCommand : public test::BinaryTest {
 protected:
  CurvesCommand() : BinaryTest(4242) {}
  std::string train(const fs::path& log, const std::string& more = "") const {
    return fmt::format("train --model gpt2-tiny --seq-len 32 --batch 2 --steps 3 --eval-every 2 "
                       "--eval-batches 1 --threads 1 --data '{}' --log '{}' {}",
                       (dir / "data").string(), log.string(), more);
  }
  std::string out() const { return test::slurp(dir / "out.txt"); }
  std::string err() const { return test::slurp(dir / "err.txt"); }
};

TEST_F(CurvesCommand, TrainWritesTheCurvesBesideItsLogAndSaysWhere) {
  ASSERT_EQ(run_memfit(train(dir / "logs" / "first.jsonl")), 0) << err();
  const fs::path page = dir / "logs" / "first.curves.html";
  ASSERT_TRUE(fs::exists(page));
  EXPECT_NE(out().find("memfit curves: " + page.string()), std::string::npos) << out();
  const std::string html = test::slurp(page);
  EXPECT_NE(html.find(R"("name":"first")"), std::string::npos);
  EXPECT_NE(html.find(R"("val_step":[2,3])"), std::string::npos);
}

TEST_F(CurvesCommand, OverlaysSeveralLogs) {
  ASSERT_EQ(run_memfit(train(dir / "a.jsonl")), 0) << err();
  ASSERT_EQ(run_memfit(train(dir / "b.jsonl", "--lr 1e-4")), 0) << err();
  const fs::path page = dir / "cmp" / "both.html";
  ASSERT_EQ(run_memfit(fmt::format("curves '{}' '{}' -o '{}'", (dir / "a.jsonl").string(),
                                   (dir / "b.jsonl").string(), page.string())),
            0)
      << err();
  EXPECT_NE(out().find("memfit curves: 2 runs drawn in " + page.string()), std::string::npos)
      << out();
  const std::string html = test::slurp(page);
  EXPECT_NE(html.find("<title>memfit training curves: a and b</title>"), std::string::npos);
  EXPECT_NE(html.find(R"("name":"a")"), std::string::npos);
  EXPECT_NE(html.find(R"("name":"b")"), std::string::npos);
  // One log without -o: beside it.
  fs::remove(dir / "a.curves.html");
  ASSERT_EQ(run_memfit(fmt::format("curves '{}'", (dir / "a.jsonl").string())), 0) << err();
  EXPECT_TRUE(fs::exists(dir / "a.curves.html"));
}

TEST_F(CurvesCommand, ABadLogExits2NamingTheFileAndTheLine) {
  const fs::path bad = dir / "bad.jsonl";
  std::ofstream(bad) << R"({"step": 1, "loss": 5.0})" << '\n' << "not json\n";
  EXPECT_EQ(run_memfit(fmt::format("curves '{}' -o '{}'", bad.string(), (dir / "x.html").string())),
            2);
  EXPECT_NE(err().find(fmt::format("[curves] {}:2: not valid JSON", bad.string())),
            std::string::npos)
      << err();
  EXPECT_FALSE(fs::exists(dir / "x.html"));
  EXPECT_EQ(run_memfit(fmt::format("curves '{}'", (dir / "absent.jsonl").string())), 2);
  EXPECT_NE(err().find("absent.jsonl: cannot read the log"), std::string::npos) << err();
  EXPECT_NE(run_memfit("curves"), 0);  // no log at all: CLI11's usage error
}

}  // namespace
}  // namespace memfit
