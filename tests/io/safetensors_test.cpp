// safetensors: the bytes match the documented layout, everything round-trips, conversions and
// transposes are exact, and every malformed file is refused naming the file and the tensor.
#include "memfit/io/checkpoint/safetensors.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "memfit/io/atomic_file.h"
#include "memfit/memory/rss.h"
#include "scratch_dir.h"

namespace memfit::io {
namespace {

namespace fs = std::filesystem;
using testing::ScratchDir;

std::string le64(uint64_t n) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return s;
}

// A file from a header string and data bytes; the length field can be forged.
fs::path write_raw(const fs::path& path, const std::string& header, const std::string& data,
                   std::optional<uint64_t> length = std::nullopt) {
  std::ofstream f(path, std::ios::binary);
  f << le64(length.value_or(header.size())) << header << data;
  return path;
}

std::string bytes_of(const void* p, size_t n) {
  return std::string(static_cast<const char*>(p), n);
}

std::string file_bytes(const fs::path& p) { return read_file_to_string(p); }

void expect_rejected(const fs::path& path, const std::vector<std::string>& needles) {
  try {
    SafetensorsReader r(path);
    ADD_FAILURE() << "expected " << path << " to be refused";
  } catch (const IoError& e) {
    std::string msg = e.what();
    EXPECT_EQ(e.op(), "safetensors");
    EXPECT_NE(msg.find(path.string()), std::string::npos) << "file not named: " << msg;
    for (const std::string& n : needles)
      EXPECT_NE(msg.find(n), std::string::npos) << "'" << n << "' not in: " << msg;
  }
}

Tensor filled(MemoryPool& pool, Shape shape, DType dtype, int seed) {
  Tensor t = Tensor::empty(pool, shape, dtype, Category::params, "t");
  auto* b = static_cast<uint8_t*>(t.raw_data());
  for (size_t i = 0; i < t.nbytes(); ++i) b[i] = static_cast<uint8_t>(i * 31 + seed * 7 + 1);
  return t;
}

TEST(Safetensors, HandBuiltBytesMatchTheDocumentedLayout) {
  ScratchDir dir;
  const float a[2] = {1.0f, -2.0f};
  const uint8_t b[3] = {1, 2, 3};
  SafetensorsWriter w;
  w.add_raw("b", SafetensorsDType::U8, {3}, b);
  w.add_raw("a", SafetensorsDType::F32, {2}, a);
  w.set_metadata("format", "pt");
  w.write(dir / "x.safetensors");

  // u64 LE header length, then the JSON padded with spaces to a multiple of 8, then the data:
  // F32 first (larger elements first), then U8.
  std::string json =
      R"({"__metadata__":{"format":"pt"},"a":{"data_offsets":[0,8],"dtype":"F32","shape":[2]},)"
      R"("b":{"data_offsets":[8,11],"dtype":"U8","shape":[3]}})";
  std::string padded = json + std::string((8 - json.size() % 8) % 8, ' ');
  std::string data = std::string("\x00\x00\x80\x3f", 4) + std::string("\x00\x00\x00\xc0", 4) +
                     std::string("\x01\x02\x03", 3);
  std::string expected = le64(padded.size()) + padded + data;
  EXPECT_EQ(file_bytes(dir / "x.safetensors"), expected);
  EXPECT_EQ(w.file_size(), expected.size());
  EXPECT_EQ(padded.size() % 8, 0u);

  // And a foreign file: unpadded header, keys in any order, spaces, no metadata.
  std::string foreign = R"({ "x" : {"shape": [2], "data_offsets": [0, 8], "dtype": "I32"} })";
  int32_t xs[2] = {-7, 1 << 20};
  write_raw(dir / "f.safetensors", foreign, bytes_of(xs, 8));
  SafetensorsReader r(dir / "f.safetensors");
  ASSERT_EQ(r.entries().size(), 1u);
  EXPECT_EQ(r.header_size(), foreign.size());
  EXPECT_TRUE(r.metadata().empty());
  const SafetensorsEntry& e = r.at("x");
  EXPECT_EQ(e.dtype, SafetensorsDType::I32);
  EXPECT_EQ(e.shape, std::vector<int64_t>{2});
  EXPECT_EQ(std::memcmp(r.bytes(e), xs, 8), 0);
}

TEST(Safetensors, RoundTripsDtypesMetadataAndEmptyTensors) {
  ScratchDir dir;
  MemoryPool pool;
  std::vector<std::pair<std::string, Tensor>> tensors = {
      {"w.f32", filled(pool, {3, 5}, DType::f32, 1)},
      {"w.bf16", filled(pool, {4}, DType::bf16, 2)},
      {"ids.i32", filled(pool, {2, 2}, DType::i32, 3)},
      {"tok.u16", filled(pool, {7}, DType::u16, 4)},
      {"q.i8", filled(pool, {3}, DType::i8, 5)},
      {"h.f16", filled(pool, {1, 3}, DType::f16, 6)},
      {"empty", Tensor::empty(pool, {0, 4}, DType::f32, Category::params, "e")},
  };
  const uint8_t u8[5] = {9, 8, 7, 6, 5};
  const double f64[2] = {3.25, -1e300};
  const int64_t scalar = -42;
  auto build = [&](bool reverse) {
    SafetensorsWriter w;
    std::vector<size_t> order;
    for (size_t i = 0; i < tensors.size(); ++i)
      order.push_back(reverse ? tensors.size() - 1 - i : i);
    for (size_t i : order) w.add(tensors[i].first, tensors[i].second);
    w.add_raw("raw.u8", SafetensorsDType::U8, {5}, u8);
    w.add_raw("raw.f64", SafetensorsDType::F64, {2}, f64);
    w.add_raw("scalar", SafetensorsDType::I64, {}, &scalar);
    w.set_metadata("format", "pt");
    w.set_metadata("note", "ünïcödé ok");
    return w;
  };
  build(false).write(dir / "a.safetensors");
  build(true).write(dir / "b.safetensors");
  // The layout does not depend on the order of add() calls.
  EXPECT_EQ(file_bytes(dir / "a.safetensors"), file_bytes(dir / "b.safetensors"));

  SafetensorsReader r(dir / "a.safetensors");
  EXPECT_EQ(r.header_size() % 8, 0u);
  EXPECT_EQ(r.file_size(), fs::file_size(dir / "a.safetensors"));
  EXPECT_EQ(r.metadata().at("format"), "pt");
  EXPECT_EQ(r.metadata().at("note"), "ünïcödé ok");
  EXPECT_EQ(r.entries().size(), tensors.size() + 3);
  // Larger elements first, each tensor aligned to its element size.
  size_t prev_size = 8;
  for (const SafetensorsEntry& e : r.entries()) {
    size_t s = safetensors_dtype_size(e.dtype);
    EXPECT_LE(s, prev_size) << e.name;
    EXPECT_EQ((r.data_offset() + e.begin) % s, 0u) << e.name;
    prev_size = s;
  }
  for (auto& [name, t] : tensors) {
    const SafetensorsEntry& e = r.at(name);
    EXPECT_EQ(e.dtype, safetensors_dtype_of(t.dtype())) << name;
    EXPECT_EQ(e.shape, std::vector<int64_t>(t.shape().begin(), t.shape().end())) << name;
    Tensor back = Tensor::empty(pool, t.shape(), t.dtype(), Category::params, "back");
    r.read(name, back);
    EXPECT_EQ(bytes_of(back.raw_data(), back.nbytes()), bytes_of(t.raw_data(), t.nbytes())) << name;
  }
  EXPECT_EQ(r.at("empty").nbytes(), 0u);
  EXPECT_EQ(r.at("scalar").shape.size(), 0u);
  EXPECT_EQ(r.at("scalar").numel(), 1);
  EXPECT_EQ(std::memcmp(r.bytes(r.at("scalar")), &scalar, 8), 0);
  EXPECT_EQ(std::memcmp(r.bytes(r.at("raw.u8")), u8, 5), 0);
  EXPECT_EQ(std::memcmp(r.bytes(r.at("raw.f64")), f64, 16), 0);
  EXPECT_EQ(r.find("nope"), nullptr);
  try {
    r.at("nope");
    FAIL();
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("'nope'"), std::string::npos) << e.what();
  }
}

TEST(Safetensors, AFileWithNoTensorsIsValid) {
  ScratchDir dir;
  SafetensorsWriter().write(dir / "none.safetensors");
  EXPECT_EQ(file_bytes(dir / "none.safetensors"), le64(8) + "{}      ");
  SafetensorsReader r(dir / "none.safetensors");
  EXPECT_TRUE(r.entries().empty());
}

TEST(Safetensors, ConvertsBetweenF32Bf16AndF16) {
  ScratchDir dir;
  MemoryPool pool;
  Tensor f = Tensor::empty(pool, {6}, DType::f32, Category::params, "f");
  const float vals[6] = {1.0f, -2.5f, 3.14159265f, 1e-30f, INFINITY, 65504.0f};
  std::memcpy(f.raw_data(), vals, sizeof vals);
  const uint16_t halves[6] = {0x3C00, 0xC000, 0x3800, 0x0001, 0x7C00, 0x8000};
  SafetensorsWriter w;
  w.add("as_f32", f);
  w.add("as_bf16", f, DType::bf16);
  w.add_raw("half", SafetensorsDType::F16, {6}, halves);
  w.write(dir / "c.safetensors");
  SafetensorsReader r(dir / "c.safetensors");
  EXPECT_EQ(r.at("as_bf16").dtype, SafetensorsDType::BF16);

  Tensor b = Tensor::empty(pool, {6}, DType::bf16, Category::params, "b");
  r.read("as_f32", b);  // f32 -> bf16 rounds to nearest even
  for (int i = 0; i < 6; ++i)
    EXPECT_EQ(static_cast<uint16_t*>(b.raw_data())[i], bf16_from_f32(vals[i])) << i;
  std::vector<uint16_t> stored(6);
  std::memcpy(stored.data(), r.bytes(r.at("as_bf16")), 12);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(stored[i], bf16_from_f32(vals[i])) << i;

  Tensor g = Tensor::empty(pool, {6}, DType::f32, Category::params, "g");
  r.read("as_bf16", g);  // bf16 -> f32 is exact
  for (int i = 0; i < 6; ++i) EXPECT_EQ(g.data<float>()[i], f32_from_bf16(bf16_from_f32(vals[i])));

  r.read("half", g);  // f16 -> f32 is exact, subnormals included
  const float want[6] = {1.0f, -2.0f, 0.5f, std::ldexp(1.0f, -24), INFINITY, -0.0f};
  for (int i = 0; i < 6; ++i) EXPECT_EQ(g.data<float>()[i], want[i]) << i;
  EXPECT_TRUE(std::signbit(g.data<float>()[5]));
}

TEST(Safetensors, TransposesOnWriteAndReadAcrossTilesAndChunks) {
  ScratchDir dir;
  MemoryPool pool;
  // (37, 70) crosses the 32x32 tiles unevenly; (600000, 3) f32 needs several 4 MiB bands.
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{37, 70}, {600000, 3}}) {
    Tensor t = Tensor::empty(pool, {rows, cols}, DType::f32, Category::params, "t");
    for (int64_t i = 0; i < rows * cols; ++i) t.data<float>()[i] = static_cast<float>(i) * 0.5f;
    SafetensorsWriter w;
    w.add("t", t, std::nullopt, true);
    w.add("tb", t, DType::bf16, true);
    w.write(dir / "t.safetensors");
    SafetensorsReader r(dir / "t.safetensors");
    const SafetensorsEntry& e = r.at("t");
    ASSERT_EQ(e.shape, (std::vector<int64_t>{cols, rows}));
    std::vector<float> raw(static_cast<size_t>(rows * cols));
    std::memcpy(raw.data(), r.bytes(e), e.nbytes());
    std::vector<uint16_t> rawb(static_cast<size_t>(rows * cols));
    std::memcpy(rawb.data(), r.bytes(r.at("tb")), r.at("tb").nbytes());
    int bad = 0;
    for (int64_t i = 0; i < rows && bad < 5; ++i)
      for (int64_t j = 0; j < cols; ++j) {
        float v = t.data<float>()[i * cols + j];
        bad += raw[j * rows + i] != v;
        bad += rawb[j * rows + i] != bf16_from_f32(v);
      }
    EXPECT_EQ(bad, 0) << rows << "x" << cols;
    Tensor back = Tensor::empty(pool, {rows, cols}, DType::f32, Category::params, "back");
    r.read("t", back, true);
    EXPECT_EQ(std::memcmp(back.raw_data(), t.raw_data(), t.nbytes()), 0);
    Tensor wrong = Tensor::empty(pool, {cols, rows}, DType::f32, Category::params, "w");
    EXPECT_THROW(r.read("t", wrong, true), IoError);
  }
}

TEST(Safetensors, ConvertsLargeTensorsInChunks) {
  ScratchDir dir;
  MemoryPool pool;
  const int64_t n = (int64_t{4} << 20) / 2 + 12345;  // more than one 4 MiB bf16 chunk
  Tensor t = Tensor::empty(pool, {n}, DType::f32, Category::params, "t");
  for (int64_t i = 0; i < n; ++i) t.data<float>()[i] = std::sin(static_cast<float>(i));
  SafetensorsWriter w;
  w.add("t", t, DType::bf16);
  w.write(dir / "big.safetensors");
  SafetensorsReader r(dir / "big.safetensors");
  Tensor b = Tensor::empty(pool, {n}, DType::bf16, Category::params, "b");
  r.read("t", b);
  int bad = 0;
  for (int64_t i = 0; i < n; ++i)
    bad += static_cast<uint16_t*>(b.raw_data())[i] != bf16_from_f32(t.data<float>()[i]);
  EXPECT_EQ(bad, 0);
}

// A reader that streams one large tensor a range at a time and releases each range once copied
// holds only about one range of the file's pages (a 7B resume reads 6.7 GB tensors this way);
// without the releases the whole tensor's pages stay resident. What is measured is the mapping's
// own resident pages (its Rss in /proc/self/smaps), not the process's RSS: under ASan the
// sanitizer's shadow and quarantine grow the process by tens of MiB in the same loop (27 MiB on
// a Zen 5), which an RSS bound read as pages the reader kept.
TEST(Safetensors, ReleasingRangesKeepsTheMappedPagesOutOfRam) {
  ScratchDir dir;
  const int64_t n = int64_t{48} << 20;  // 192 MiB of f32
  {
    MemoryPool pool;
    Tensor t = Tensor::empty(pool, {n}, DType::f32, Category::params, "t");
    for (int64_t i = 0; i < n; ++i) t.data<float>()[i] = static_cast<float>(i % 1000);
    SafetensorsWriter w;
    w.add("t", t);
    w.write(dir / "big.safetensors");
  }
  const uint64_t piece = 4 << 20;
  std::vector<char> buf(piece);
  auto stream = [&](bool release) {
    SafetensorsReader r(dir / "big.safetensors");
    const SafetensorsEntry& e = r.at("t");
    size_t most = 0;
    for (uint64_t at = 0; at < e.nbytes(); at += piece) {
      const uint64_t len = std::min<uint64_t>(piece, e.nbytes() - at);
      std::memcpy(buf.data(), r.bytes(e) + at, len);
      if (release) r.release_before(e, at + len);
      most = std::max(most, mapping_rss_bytes(r.bytes(e)));
    }
    return most;
  };
  const size_t kept = stream(false), released = stream(true);
  // Unreleased, the mapping holds every page read (192 MiB, the header's page aside); released,
  // at most the range being copied and the pages the kernel maps around a fault (fault-around
  // and the partial page at the range's end), far below two ranges.
  EXPECT_GE(kept, size_t{190} << 20) << "the unreleased pages should stay resident";
  EXPECT_LT(released, 2 * piece) << "each range's pages should leave as it goes";
}

TEST(Safetensors, ReadRefusesAWrongDestination) {
  ScratchDir dir;
  MemoryPool pool;
  Tensor ids = filled(pool, {4}, DType::i32, 1);
  SafetensorsWriter w;
  w.add("ids", ids);
  w.write(dir / "r.safetensors");
  SafetensorsReader r(dir / "r.safetensors");
  Tensor f = Tensor::empty(pool, {4}, DType::f32, Category::params, "f");
  try {
    r.read("ids", f);
    FAIL();
  } catch (const IoError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("'ids'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("I32"), std::string::npos) << msg;
  }
  Tensor small = Tensor::empty(pool, {3}, DType::i32, Category::params, "s");
  try {
    r.read("ids", small);
    FAIL();
  } catch (const IoError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("(4,)"), std::string::npos) << msg;
    EXPECT_NE(msg.find("(3,)"), std::string::npos) << msg;
  }
}

TEST(Safetensors, WriterRefusesBadNames) {
  MemoryPool pool;
  Tensor t = filled(pool, {2}, DType::f32, 0);
  SafetensorsWriter w;
  w.add("a", t);
  EXPECT_THROW(w.add("a", t), Error);
  EXPECT_THROW(w.add("__metadata__", t), Error);
  EXPECT_THROW(w.add("i", filled(pool, {2}, DType::i32, 0), DType::f32), DTypeError);
  EXPECT_THROW(w.add("v", t, std::nullopt, /*transpose=*/true), ShapeError);
}

TEST(Safetensors, RefusesEveryMalformedFile) {
  ScratchDir dir;
  auto f32 = [](const char* name, const char* shape, uint64_t b, uint64_t e) {
    return fmt::format(R"("{}": {{"dtype": "F32", "shape": {}, "data_offsets": [{}, {}]}})", name,
                       shape, b, e);
  };
  std::string four(4, '\0'), eight(8, '\0'), twelve(12, '\0');

  // Truncated: the last tensor's bytes are cut off.
  {
    float v[3] = {1, 2, 3};
    SafetensorsWriter w;
    w.add_raw("weights", SafetensorsDType::F32, {3}, v);
    w.write(dir / "trunc.safetensors");
    fs::resize_file(dir / "trunc.safetensors", fs::file_size(dir / "trunc.safetensors") - 3);
    expect_rejected(dir / "trunc.safetensors",
                    {"'weights'", "run past the data section", "[0, 12]"});
  }
  {
    std::ofstream(dir / "tiny.safetensors", std::ios::binary) << "abc";
    expect_rejected(dir / "tiny.safetensors", {"3 bytes", "too short"});
  }
  write_raw(dir / "past.safetensors", "{" + f32("w", "[1]", 0, 4) + "}", four, 4096);
  expect_rejected(dir / "past.safetensors", {"header length 4096", "past the end of the file"});
  write_raw(dir / "huge.safetensors", "{}", "", uint64_t{1} << 40);
  expect_rejected(dir / "huge.safetensors", {"exceeds"});
  write_raw(dir / "json.safetensors", R"({"w": {"dtype": "F32", "shape": [1],)", four);
  expect_rejected(dir / "json.safetensors", {"not valid JSON"});
  write_raw(dir / "array.safetensors", "[1, 2]", "");
  expect_rejected(dir / "array.safetensors", {"does not start with '{'"});
  write_raw(dir / "dtype.safetensors",
            R"({"w": {"dtype": "F33", "shape": [1], "data_offsets": [0, 4]}})", four);
  expect_rejected(dir / "dtype.safetensors", {"'w'", "unknown dtype \"F33\"", "BF16"});
  write_raw(dir / "size.safetensors", "{" + f32("w", "[2, 3]", 0, 20) + "}", std::string(20, '\0'));
  expect_rejected(dir / "size.safetensors", {"'w'", "(2, 3) need 24 bytes", "[0, 20] hold 20"});
  write_raw(dir / "overlap.safetensors",
            "{" + f32("a", "[2]", 0, 8) + ", " + f32("b", "[2]", 4, 12) + "}", twelve);
  expect_rejected(dir / "overlap.safetensors", {"'b'", "overlap tensor 'a'"});
  write_raw(dir / "hole.safetensors",
            "{" + f32("a", "[1]", 0, 4) + ", " + f32("b", "[1]", 8, 12) + "}", twelve);
  expect_rejected(dir / "hole.safetensors", {"'b'", "hole", "[4, 8)", "after tensor 'a'"});
  write_raw(dir / "lead.safetensors", "{" + f32("a", "[1]", 4, 8) + "}", eight);
  expect_rejected(dir / "lead.safetensors", {"'a'", "hole", "[0, 4)"});
  write_raw(dir / "tail.safetensors", "{" + f32("a", "[1]", 0, 4) + "}", eight);
  expect_rejected(dir / "tail.safetensors", {"[4, 8)", "belong to no tensor", "after tensor 'a'"});
  write_raw(dir / "missing.safetensors", R"({"w": {"dtype": "F32", "shape": [1]}})", four);
  expect_rejected(dir / "missing.safetensors", {"'w'", "missing \"data_offsets\""});
  write_raw(dir / "dup.safetensors",
            "{" + f32("w", "[1]", 0, 4) + ", " + f32("w", "[1]", 4, 8) + "}", eight);
  expect_rejected(dir / "dup.safetensors", {"'w' appears twice"});
  write_raw(dir / "meta.safetensors", R"({"__metadata__": {"step": 3}})", "");
  expect_rejected(dir / "meta.safetensors", {"__metadata__", "'step'", "string"});
  write_raw(dir / "neg.safetensors", "{" + f32("w", "[-1]", 0, 4) + "}", four);
  expect_rejected(dir / "neg.safetensors", {"'w'", "non-negative"});
  write_raw(dir / "backwards.safetensors", "{" + f32("w", "[1]", 4, 0) + "}", four);
  expect_rejected(dir / "backwards.safetensors", {"'w'", "begin <= end"});
  write_raw(dir / "entry.safetensors", R"({"w": 5})", "");
  expect_rejected(dir / "entry.safetensors", {"'w'", "must be an object"});
  write_raw(dir / "overflow.safetensors", "{" + f32("w", "[4294967296, 4294967296]", 0, 4) + "}",
            four);
  expect_rejected(dir / "overflow.safetensors", {"'w'", "more than 2^64"});
  expect_rejected(dir / "absent.safetensors", {"cannot open", "No such file"});
}

}  // namespace
}  // namespace memfit::io
