// Sharded safetensors: shard planning, --max-shard-size parsing, the files and index a sharded
// write produces, and indexes that do not match their files (a missing file, a tensor in two
// files, a tensor listed twice or not at all), each refused naming the index, file and tensor.
#include "memfit/io/checkpoint/sharded_safetensors.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "memfit/core/error.h"
#include "memfit/io/atomic_file.h"
#include "checkpoint_test_util.h"
#include "scratch_dir.h"

namespace memfit::io {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using testing::ScratchDir;
using testing::expect_contains;
using testing::list_dir;

std::string error_of(const fs::path& path) {
  try {
    ModelSafetensors files(path);
  } catch (const IoError& e) {
    return e.what();
  }
  ADD_FAILURE() << "accepted " << path;
  return "";
}

TEST(ShardedSafetensors, PlansShardsInOrderNeverSplittingATensor) {
  EXPECT_EQ(plan_shards({}, 10), std::vector<int>{});
  EXPECT_EQ(plan_shards({4, 4, 4}, 100), (std::vector<int>{0, 0, 0}));
  EXPECT_EQ(plan_shards({4, 4, 4}, 8), (std::vector<int>{0, 0, 1}));
  EXPECT_EQ(plan_shards({4, 20, 4, 4}, 8), (std::vector<int>{0, 1, 2, 2}));  // 20 alone
  EXPECT_EQ(plan_shards({9, 9}, 8), (std::vector<int>{0, 1}));
  EXPECT_EQ(plan_shards({0, 8, 0, 1}, 8), (std::vector<int>{0, 0, 0, 1}));
  EXPECT_EQ(shard_file_name(2, 5), "model-00002-of-00005.safetensors");
}

TEST(ShardedSafetensors, ParsesMaxShardSizeAsTransformersDoes) {
  EXPECT_EQ(parse_max_shard_size("5GB"), 5'000'000'000u);
  EXPECT_EQ(parse_max_shard_size("200MB"), 200'000'000u);
  EXPECT_EQ(parse_max_shard_size("10kb"), 10'000u);
  EXPECT_EQ(parse_max_shard_size("2GiB"), uint64_t{2} << 30);
  EXPECT_EQ(parse_max_shard_size("1.5MiB"), uint64_t{3} << 19);
  EXPECT_EQ(parse_max_shard_size("4096"), 4096u);
  for (const char* bad : {"", "0", "-1GB", "5 parsecs", "GB", "0.1"})
    EXPECT_THROW(parse_max_shard_size(bad), ConfigError) << bad;
}

// Six f32 tensors of 64 bytes each, written with a 150-byte limit: three shards of two.
std::vector<ShardTensor> six(MemoryPool& pool) {
  std::vector<ShardTensor> out;
  for (int i = 0; i < 6; ++i) {
    Tensor t = Tensor::empty(pool, {4, 4}, DType::f32, Category::params, "t");
    for (int j = 0; j < 16; ++j) t.data<float>()[j] = static_cast<float>(i * 100 + j);
    ShardTensor s;
    s.name = fmt::format("w{}", 5 - i);  // names not in order
    s.tensor = t;
    s.transpose = i == 1;
    out.push_back(std::move(s));
  }
  return out;
}

TEST(ShardedSafetensors, WritesShardsAndAnIndexAndReadsThemBack) {
  ScratchDir root;
  MemoryPool pool;
  std::vector<ShardTensor> tensors = six(pool);
  ShardedWriteOptions o;
  o.max_shard_bytes = 150;
  o.metadata["format"] = "pt";
  std::vector<std::string> written = write_model_safetensors(root.path(), tensors, o);
  const std::vector<std::string> files = {
      "model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors",
      "model-00003-of-00003.safetensors", "model.safetensors.index.json"};
  EXPECT_EQ(written, files);
  EXPECT_EQ(list_dir(root.path()), files);
  json index = json::parse(read_file_to_string(root / "model.safetensors.index.json"));
  EXPECT_EQ(index["metadata"]["total_size"], 6 * 64);
  EXPECT_EQ(index["weight_map"]["w5"], files[0]);  // layout order, not name order
  EXPECT_EQ(index["weight_map"]["w4"], files[0]);
  EXPECT_EQ(index["weight_map"]["w3"], files[1]);
  EXPECT_EQ(index["weight_map"]["w0"], files[2]);

  for (const fs::path& p : {root.path(), root / "model.safetensors.index.json"}) {
    ModelSafetensors m(p);
    EXPECT_TRUE(m.sharded());
    ASSERT_EQ(m.tensors().size(), 6u);
    const StoredTensor* w4 = m.find("w4");
    ASSERT_NE(w4, nullptr);
    EXPECT_EQ(m.where(*w4), " in model-00001-of-00003.safetensors");
    EXPECT_EQ(w4->file->metadata().at("format"), "pt");
    Tensor back = Tensor::empty(pool, {4, 4}, DType::f32, Category::params, "b");
    w4->file->read(*w4->entry, back, /*transpose=*/true);  // stored transposed
    EXPECT_EQ(back.data<float>()[1], 101.0f);
  }

  // Small enough: one model.safetensors, no index.
  fs::create_directories(root / "one");
  EXPECT_EQ(write_model_safetensors(root / "one", tensors),
            std::vector<std::string>{"model.safetensors"});
  ModelSafetensors m(root / "one");
  EXPECT_FALSE(m.sharded());
  EXPECT_EQ(m.where(m.tensors()[0]), "");
  fs::create_directories(root / "empty");
  expect_contains(error_of(root / "empty"),
                  {"neither model.safetensors nor model.safetensors.index.json"});
}

class CorruptIndex : public ::testing::Test {
 protected:
  void SetUp() override {
    ShardedWriteOptions o;
    o.max_shard_bytes = 150;
    write_model_safetensors(root.path(), six(pool), o);
    index = json::parse(read_file_to_string(root / "model.safetensors.index.json"));
  }
  void write_index(const std::string& text) {
    write_file_atomic(root / "model.safetensors.index.json", text);
  }
  ScratchDir root;
  MemoryPool pool;
  json index;
};

TEST_F(CorruptIndex, AMissingFileIsNamed) {
  fs::remove(root / "model-00002-of-00003.safetensors");
  expect_contains(error_of(root.path()),
                  {"model.safetensors.index.json", "1 problem:",
                   "model-00002-of-00003.safetensors does not exist (the index maps 'w2' and 1 "
                   "more to it)"});
}

TEST_F(CorruptIndex, ATensorInTwoFilesIsADuplicate) {
  MemoryPool p;
  SafetensorsWriter w;  // shard 3 gets a second copy of w4, which shard 1 holds
  Tensor t = Tensor::empty(p, {4, 4}, DType::f32, Category::params, "t");
  for (const char* name : {"w1", "w0", "w4"}) w.add(name, t);
  w.write(root / "model-00003-of-00003.safetensors");
  expect_contains(error_of(root.path()),
                  {"'w4' is in both model-00001-of-00003.safetensors and "
                   "model-00003-of-00003.safetensors"});
}

TEST_F(CorruptIndex, ATensorListedTwiceIsADuplicate) {
  std::string text = index.dump(2);
  const std::string entry = "\"w0\": \"model-00003-of-00003.safetensors\"";
  ASSERT_NE(text.find(entry), std::string::npos);
  text.replace(text.find(entry), entry.size(), entry + ",\n    " + entry);
  write_index(text);
  expect_contains(error_of(root.path()), {"'w0' is listed twice in weight_map"});
}

TEST_F(CorruptIndex, TensorsTheIndexLeavesOutOrMisplacesAreNamed) {
  index["weight_map"].erase("w3");
  index["weight_map"]["w1"] = "model-00001-of-00003.safetensors";
  index["weight_map"]["ghost"] = "model-00003-of-00003.safetensors";
  write_index(index.dump());
  expect_contains(error_of(root.path()),
                  {"3 problems:",
                   "model-00002-of-00003.safetensors holds 'w3', which the index does not list",
                   "model-00003-of-00003.safetensors holds 'w1', which the index puts in "
                   "model-00001-of-00003.safetensors",
                   "the index puts 'ghost' in model-00003-of-00003.safetensors, which does not "
                   "hold it"});
}

TEST_F(CorruptIndex, MalformedIndexesAreRefused) {
  for (const char* text :
       {"{", "[]", "{\"metadata\": {}}", "{\"weight_map\": {\"w0\": 3}}",
        "{\"weight_map\": {\"w0\": \"../model-00001-of-00003.safetensors\"}}",
        "{\"weight_map\": {\"w0\": \"/etc/passwd\"}}"}) {
    write_index(text);
    expect_contains(error_of(root.path()), {"model.safetensors.index.json"});
  }
}

}  // namespace
}  // namespace memfit::io
