// check_ranks_agree: equal fields pass; a field that differs on one rank fails on every rank with
// the field's name and both ranks' values (and the names of other differing fields). The
// disagreeing cases need two ranks: `ctest -L dist-mpi` runs this file under mpirun -n 2.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "memfit/dist/agreement.h"

namespace memfit::dist {
namespace {

TEST(Agreement, EqualFieldsPass) {
  auto comm = make_world_communicator();
  EXPECT_NO_THROW(check_ranks_agree(*comm, {{"--lr", "0.0006"}, {"the model", "gpt2"}}));
}

TEST(Agreement, ADifferentValueIsNamedWithBothRanksValuesOnEveryRank) {
  auto comm = make_world_communicator();
  if (comm->size() < 2) GTEST_SKIP() << "needs two ranks (ctest -L dist-mpi)";
  const bool other = comm->rank() == 1;
  const std::vector<AgreedField> fields = {{"the model", "gpt2"},
                                           {"--lr", other ? "0.001" : "0.0006"},
                                           {"--batch", "4"},
                                           {"--seed", other ? "2" : "1"}};
  try {
    check_ranks_agree(*comm, fields);
    FAIL() << "no error";
  } catch (const DisagreementError& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "ranks disagree about --lr: rank 0 has 0.0006, rank 1 has 0.001 (also: --seed)"),
              std::string::npos)
        << e.what();
  }
  // Afterwards the ranks are in step.
  EXPECT_NO_THROW(check_ranks_agree(*comm, {{"--batch", "4"}}));
}

TEST(Agreement, ADifferentSetOfFieldsIsNamed) {
  auto comm = make_world_communicator();
  if (comm->size() < 2) GTEST_SKIP() << "needs two ranks (ctest -L dist-mpi)";
  std::vector<AgreedField> fields = {{"--lr", "1"}};
  if (comm->rank() == 1) fields.push_back({"--zero", "1"});
  try {
    check_ranks_agree(*comm, fields);
    FAIL() << "no error";
  } catch (const DisagreementError& e) {
    EXPECT_NE(std::string(e.what()).find("rank 0 checks 1 fields, rank 1 2"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace memfit::dist
