// Past one machine (issue 14, part 6): two "hosts" as network namespaces joined by a veth pair
// (10.77.0.1 and 10.77.0.2), mpirun started in the first and launching the second rank in the
// second through an `ip netns exec` launch agent (OpenMPI's rsh launcher with plm_rsh_agent),
// the ranks talking over TCP (btl tcp). The losses equal those of the same run on one host
// bit for bit: memfit adds in rank order whatever the transport (Note [Deterministic
// reduction]). Skips with a message where namespaces cannot be made (not root, no CAP_SYS_ADMIN,
// no `ip`) or memfit was built without MPI.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli_test_util.h"

namespace memfit {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using test::slurp;

int shell(const std::string& command) {
  const int status = std::system(command.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

class TwoHosts : public test::BinaryTest {
 protected:
  TwoHosts() : BinaryTest(4242) {}
  void SetUp() override {
    if (std::string(MEMFIT_MPIEXEC).empty()) GTEST_SKIP() << "memfit was built without MPI";
    if (::geteuid() != 0) GTEST_SKIP() << "network namespaces need root";
    BinaryTest::SetUp();
    ns_ = fmt::format("mf{}", ::getpid());
    const std::string a = ns_ + "a", b = ns_ + "b";
    made_ = shell(fmt::format("ip netns add {} 2>/dev/null", a)) == 0;
    if (!made_) GTEST_SKIP() << "cannot make network namespaces here (`ip netns add` failed)";
    const std::string setup = fmt::format(
        "ip netns add {b} && ip link add {n}va type veth peer name {n}vb && "
        "ip link set {n}va netns {a} && ip link set {n}vb netns {b} && "
        "ip -n {a} addr add 10.77.0.1/24 dev {n}va && ip -n {b} addr add 10.77.0.2/24 dev {n}vb && "
        "ip -n {a} link set {n}va up && ip -n {b} link set {n}vb up && "
        "ip -n {a} link set lo up && ip -n {b} link set lo up",
        fmt::arg("a", a), fmt::arg("b", b), fmt::arg("n", ns_));
    if (shell(setup + " 2>'" + (dir / "setup.txt").string() + "'") != 0)
      GTEST_SKIP() << "cannot join the namespaces with a veth pair: " << slurp(dir / "setup.txt");
    // OpenMPI's rsh launcher runs "AGENT HOST COMMAND...": here COMMAND runs in HOST's namespace.
    std::ofstream agent(dir / "agent.sh");
    agent << "#!/bin/sh\nhost=$1; shift\necho \"$host\" >> '" << (dir / "launched.txt").string()
          << "'\ncase $host in\n  10.77.0.1) ns=" << a << " ;;\n  10.77.0.2) ns=" << b
          << " ;;\n  *) echo \"unknown host $host\" >&2; exit 1 ;;\nesac\n"
          << "exec ip netns exec $ns /bin/sh -c \"$*\"\n";
    agent.close();
    ::chmod((dir / "agent.sh").c_str(), 0755);
  }
  void TearDown() override {
    if (made_) shell(fmt::format("ip netns del {}a 2>/dev/null; ip netns del {}b 2>/dev/null", ns_, ns_));
    BinaryTest::TearDown();
  }
  std::string train(const std::string& log) const {
    return fmt::format("{}/memfit train --model gpt2-tiny --n-layer 2 --seq-len 32 --batch 2 "
                       "--steps 6 --eval-every 3 --eval-batches 2 --threads 1 --data '{}' "
                       "--log '{}'",
                       MEMFIT_BINARY_DIR, (dir / "data").string(), (dir / log).string());
  }
  std::vector<json> lines(const std::string& log) const {
    std::vector<json> out;
    std::istringstream in(slurp(dir / log));
    for (std::string line; std::getline(in, line);) out.push_back(json::parse(line));
    return out;
  }
  int run(const std::string& command) const {
    return shell(fmt::format("ASAN_OPTIONS=detect_leaks=0 {} > '{}' 2>&1", command,
                             (dir / "out.txt").string()));
  }

  std::string ns_;
  bool made_ = false;
};

TEST_F(TwoHosts, RanksInTwoNamespacesOverTcpTrainAsOnOneHost) {
  ASSERT_EQ(run(fmt::format("{} -n 2 --allow-run-as-root --oversubscribe {}", MEMFIT_MPIEXEC,
                            train("one.jsonl"))),
            0)
      << slurp(dir / "out.txt");
  ASSERT_EQ(run(fmt::format(
                "ip netns exec {}a {} --allow-run-as-root --oversubscribe "
                "--host 10.77.0.1:1,10.77.0.2:1 -n 2 --mca plm_rsh_agent '{}' "
                "--mca btl tcp,self --mca btl_tcp_if_include 10.77.0.0/24 "
                "--mca oob_tcp_if_include 10.77.0.0/24 {}",
                ns_, MEMFIT_MPIEXEC, (dir / "agent.sh").string(), train("two.jsonl"))),
            0)
      << slurp(dir / "out.txt");
  // The second host was reached through the agent.
  EXPECT_NE(slurp(dir / "launched.txt").find("10.77.0.2"), std::string::npos);
  const std::vector<json> one = lines("one.jsonl"), two = lines("two.jsonl");
  ASSERT_EQ(one.size(), two.size());
  int compared = 0;
  for (size_t i = 0; i < one.size(); ++i)
    for (const char* key : {"loss", "val_loss"})
      if (one[i].contains(key)) {
        EXPECT_EQ(one[i][key], two[i][key]) << key << " at step " << one[i]["step"];
        ++compared;
      }
  EXPECT_EQ(compared, 8);  // 6 losses, 2 evaluations
}

}  // namespace
}  // namespace memfit
