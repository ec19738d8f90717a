// safetensors reading (mmap + validation) and writing (streamed through atomic_file). The
// format: https://github.com/huggingface/safetensors#format; notes in docs/notes/checkpoints.md.
#include "memfit/io/checkpoint/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>
#include <utility>

#include "memfit/core/error.h"
#include "memfit/io/atomic_file.h"

namespace memfit::io {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

struct DTypeInfo {
  SafetensorsDType dtype;
  std::string_view name;
  size_t size;
};
constexpr std::array<DTypeInfo, 17> kDTypes = {{
    {SafetensorsDType::BOOL, "BOOL", 1},
    {SafetensorsDType::U8, "U8", 1},
    {SafetensorsDType::I8, "I8", 1},
    {SafetensorsDType::F8_E5M2, "F8_E5M2", 1},
    {SafetensorsDType::F8_E4M3, "F8_E4M3", 1},
    {SafetensorsDType::F8_E8M0, "F8_E8M0", 1},
    {SafetensorsDType::I16, "I16", 2},
    {SafetensorsDType::U16, "U16", 2},
    {SafetensorsDType::F16, "F16", 2},
    {SafetensorsDType::BF16, "BF16", 2},
    {SafetensorsDType::I32, "I32", 4},
    {SafetensorsDType::U32, "U32", 4},
    {SafetensorsDType::F32, "F32", 4},
    {SafetensorsDType::F64, "F64", 8},
    {SafetensorsDType::I64, "I64", 8},
    {SafetensorsDType::U64, "U64", 8},
    {SafetensorsDType::C64, "C64", 8},
}};

// info() indexes the table by enum value.
constexpr bool table_in_enum_order() {
  for (size_t i = 0; i < kDTypes.size(); ++i)
    if (static_cast<size_t>(kDTypes[i].dtype) != i) return false;
  return true;
}
static_assert(table_in_enum_order());

const DTypeInfo& info(SafetensorsDType d) { return kDTypes[static_cast<size_t>(d)]; }

std::string known_dtype_names() {
  std::string s;
  for (const DTypeInfo& d : kDTypes) s += (s.empty() ? "" : ", ") + std::string(d.name);
  return s;
}

// IEEE half to float (exact: every half is a float).
float f32_from_f16(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, u;
  if (exp == 0x1f) {
    u = sign | 0x7f800000u | (man << 13);  // inf or NaN
  } else if (exp != 0) {
    u = sign | ((exp + 112) << 23) | (man << 13);
  } else if (man == 0) {
    u = sign;  // signed zero
  } else {     // subnormal: normalize
    int e = -1;
    do {
      ++e;
      man <<= 1;
    } while ((man & 0x400u) == 0);
    u = sign | (static_cast<uint32_t>(112 - e) << 23) | ((man & 0x3ffu) << 13);
  }
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

// Copies a (rows, cols) matrix whose rows lie src_stride elements apart into a contiguous dst,
// as (rows, cols), or as (cols, rows) when transposing (in 32x32 tiles, to stay in cache).
// Elements go through memcpy because a foreign file's data need not be aligned.
template <typename S, typename D, typename F>
void convert_loop(const std::byte* src, int64_t src_stride, std::byte* dst, int64_t rows,
                  int64_t cols, bool transpose, F f) {
  auto move = [&](int64_t i, int64_t j, int64_t out) {
    S s;
    std::memcpy(&s, src + static_cast<size_t>(i * src_stride + j) * sizeof(S), sizeof(S));
    D d = f(s);
    std::memcpy(dst + static_cast<size_t>(out) * sizeof(D), &d, sizeof(D));
  };
  if (!transpose) {
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j) move(i, j, i * cols + j);
    return;
  }
  constexpr int64_t kTile = 32;
  for (int64_t i0 = 0; i0 < rows; i0 += kTile)
    for (int64_t j0 = 0; j0 < cols; j0 += kTile)
      for (int64_t i = i0; i < std::min(rows, i0 + kTile); ++i)
        for (int64_t j = j0; j < std::min(cols, j0 + kTile); ++j) move(i, j, j * rows + i);
}

bool can_convert(SafetensorsDType from, SafetensorsDType to) {
  using T = SafetensorsDType;
  if (from == to) return true;
  return (to == T::F32 || to == T::BF16) && (from == T::F32 || from == T::BF16 || from == T::F16);
}

// See convert_loop; the pair must pass can_convert.
void convert_matrix(const std::byte* src, SafetensorsDType from, int64_t src_stride, std::byte* dst,
                    SafetensorsDType to, int64_t rows, int64_t cols, bool transpose) {
  using T = SafetensorsDType;
  auto same = [](auto x) { return x; };
  if (from == to) {
    if (!transpose && src_stride == cols) {
      std::memcpy(dst, src, static_cast<size_t>(rows * cols) * info(from).size);
      return;
    }
    switch (info(from).size) {
      case 1:
        return convert_loop<uint8_t, uint8_t>(src, src_stride, dst, rows, cols, transpose, same);
      case 2:
        return convert_loop<uint16_t, uint16_t>(src, src_stride, dst, rows, cols, transpose, same);
      case 4:
        return convert_loop<uint32_t, uint32_t>(src, src_stride, dst, rows, cols, transpose, same);
      default:
        return convert_loop<uint64_t, uint64_t>(src, src_stride, dst, rows, cols, transpose, same);
    }
  }
  auto go = [&](auto s_tag, auto d_tag, auto f) {
    convert_loop<decltype(s_tag), decltype(d_tag)>(src, src_stride, dst, rows, cols, transpose, f);
  };
  if (from == T::F32 && to == T::BF16) return go(float{}, uint16_t{}, bf16_from_f32);
  if (from == T::BF16 && to == T::F32) return go(uint16_t{}, float{}, f32_from_bf16);
  if (from == T::F16 && to == T::F32) return go(uint16_t{}, float{}, f32_from_f16);
  if (from == T::F16 && to == T::BF16)
    return go(uint16_t{}, uint16_t{}, [](uint16_t h) { return bf16_from_f32(f32_from_f16(h)); });
  MEMFIT_THROW(Error, "safetensors", "no conversion from {} to {}", info(from).name, info(to).name);
}

[[noreturn]] void fail_errno(const fs::path& path, const char* what) {
  int err = errno;
  MEMFIT_THROW(IoError, "safetensors", "{}: {}: {}", path.string(), what, std::strerror(err));
}

}  // namespace

size_t safetensors_dtype_size(SafetensorsDType dtype) { return info(dtype).size; }
std::string_view safetensors_dtype_name(SafetensorsDType dtype) { return info(dtype).name; }

std::optional<SafetensorsDType> safetensors_dtype_parse(std::string_view name) {
  for (const DTypeInfo& d : kDTypes)
    if (d.name == name) return d.dtype;
  return std::nullopt;
}

SafetensorsDType safetensors_dtype_of(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return SafetensorsDType::F32;
    case DType::bf16:
      return SafetensorsDType::BF16;
    case DType::f16:
      return SafetensorsDType::F16;
    case DType::i8:
      return SafetensorsDType::I8;
    case DType::i32:
      return SafetensorsDType::I32;
    case DType::u16:
      return SafetensorsDType::U16;
    case DType::u8:
      return SafetensorsDType::U8;
  }
  MEMFIT_THROW(Error, "safetensors", "no safetensors type for dtype {}", static_cast<int>(dtype));
}

std::optional<DType> memfit_dtype_of(SafetensorsDType dtype) {
  for (DType d : {DType::f32, DType::bf16, DType::f16, DType::i8, DType::i32, DType::u16,
                  DType::u8})
    if (safetensors_dtype_of(d) == dtype) return d;
  return std::nullopt;
}

std::string format_shape(const std::vector<int64_t>& shape) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + (shape.size() == 1 ? ",)" : ")");
}

int64_t SafetensorsEntry::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// ---------------------------------------------------------------------------------------------
// Writer

void SafetensorsWriter::check_new_name(const std::string& name) const {
  MEMFIT_CHECK(!name.empty() && name != "__metadata__", "safetensors", "'{}' cannot name a tensor",
               name);
  for (const Item& it : items_)
    MEMFIT_CHECK(it.name != name, "safetensors", "tensor '{}' added twice", name);
}

void SafetensorsWriter::add(std::string name, const Tensor& tensor, std::optional<DType> store_as,
                            bool transpose) {
  check_new_name(name);
  MEMFIT_CHECK(tensor.defined() && tensor.is_contiguous(), "safetensors",
               "tensor '{}' must be defined and contiguous", name);
  SafetensorsDType from = safetensors_dtype_of(tensor.dtype());
  SafetensorsDType to = safetensors_dtype_of(store_as.value_or(tensor.dtype()));
  MEMFIT_CHECK_DTYPE(can_convert(from, to), "safetensors", "tensor '{}': cannot store {} as {}",
                     name, info(from).name, info(to).name);
  std::vector<int64_t> shape(tensor.shape().begin(), tensor.shape().end());
  if (transpose) {
    MEMFIT_CHECK_SHAPE(shape.size() == 2, "safetensors",
                       "tensor '{}': transposing needs 2-D, got {}", name, tensor.shape());
    std::swap(shape[0], shape[1]);
  }
  items_.push_back({std::move(name), to, std::move(shape), nullptr, tensor, transpose, {}, {},
                    DType::f32});
}

void SafetensorsWriter::add_raw(std::string name, SafetensorsDType dtype,
                                std::vector<int64_t> shape, const void* data) {
  check_new_name(name);
  for (int64_t d : shape)
    MEMFIT_CHECK_SHAPE(d >= 0, "safetensors", "tensor '{}': negative dimension in {}", name,
                       format_shape(shape));
  items_.push_back({std::move(name), dtype, std::move(shape), data, Tensor(), false, {}, {},
                    DType::f32});
}

void SafetensorsWriter::add_deferred(std::string name, std::vector<int64_t> shape, DType dtype,
                                     std::function<Tensor()> produce,
                                     std::optional<DType> store_as, bool transpose) {
  check_new_name(name);
  SafetensorsDType from = safetensors_dtype_of(dtype);
  SafetensorsDType to = safetensors_dtype_of(store_as.value_or(dtype));
  MEMFIT_CHECK_DTYPE(can_convert(from, to), "safetensors", "tensor '{}': cannot store {} as {}",
                     name, info(from).name, info(to).name);
  std::vector<int64_t> stored = shape;
  if (transpose) {
    MEMFIT_CHECK_SHAPE(stored.size() == 2, "safetensors",
                       "tensor '{}': transposing needs 2-D, got {}", name, format_shape(shape));
    std::swap(stored[0], stored[1]);
  }
  items_.push_back({std::move(name), to, std::move(stored), nullptr, Tensor(), transpose,
                    std::move(produce), std::move(shape), dtype});
}

void SafetensorsWriter::add_source(std::string name, SafetensorsDType dtype,
                                   std::vector<int64_t> shape,
                                   std::function<void(const ByteSink&)> source) {
  add_raw(std::move(name), dtype, std::move(shape), nullptr);
  items_.back().source = std::move(source);
}

size_t SafetensorsWriter::add_scattered(std::string name, SafetensorsDType dtype,
                                        std::vector<int64_t> shape) {
  add_raw(std::move(name), dtype, std::move(shape), nullptr);
  items_.back().scattered = true;
  return items_.size() - 1;
}

void SafetensorsWriter::set_metadata(const std::string& key, const std::string& value) {
  metadata_[key] = value;
}

std::vector<const SafetensorsWriter::Item*> SafetensorsWriter::ordered() const {
  std::vector<const Item*> out;
  for (const Item& it : items_) out.push_back(&it);
  std::sort(out.begin(), out.end(), [](const Item* a, const Item* b) {
    size_t sa = info(a->dtype).size, sb = info(b->dtype).size;
    return sa != sb ? sa > sb : a->name < b->name;
  });
  return out;
}

namespace {
uint64_t item_bytes(SafetensorsDType dtype, const std::vector<int64_t>& shape) {
  uint64_t n = info(dtype).size;
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n;
}
}  // namespace

std::string SafetensorsWriter::header_json() const {
  json header = json::object();
  uint64_t offset = 0;
  for (const Item* it : ordered()) {
    uint64_t n = item_bytes(it->dtype, it->shape);
    header[it->name] = {{"dtype", std::string(info(it->dtype).name)},
                        {"shape", it->shape},
                        {"data_offsets", {offset, offset + n}}};
    offset += n;
  }
  if (!metadata_.empty()) header["__metadata__"] = metadata_;
  try {
    return header.dump();
  } catch (const json::exception& e) {
    MEMFIT_THROW(IoError, "safetensors",
                 "header cannot be written as JSON (names must be UTF-8): {}", e.what());
  }
}

uint64_t SafetensorsWriter::file_size() const {
  uint64_t n = (header_json().size() + 7) / 8 * 8;
  for (const Item& it : items_) n += item_bytes(it.dtype, it.shape);
  return 8 + n;
}

namespace {

// The writer's staging chunk: conversions go kStagingChunkBytes of output at a time, transposes
// a band of source columns (stored rows) of about that size, at least one.
constexpr size_t kStagingChunkBytes = size_t{4} << 20;

// Elements of `size` bytes in one conversion chunk.
int64_t conversion_step(size_t size) {
  return std::max<int64_t>(1, static_cast<int64_t>(kStagingChunkBytes / size));
}

int64_t transposed_band(size_t out_size, int64_t rows) {
  return std::max<int64_t>(
      1, static_cast<int64_t>(kStagingChunkBytes /
                              (out_size * static_cast<size_t>(std::max<int64_t>(rows, 1)))));
}

}  // namespace

size_t SafetensorsWriter::staging_bytes(SafetensorsDType from, SafetensorsDType to, int64_t rows,
                                        int64_t cols, bool transpose) {
  if (from == to && !transpose) return 0;
  const size_t out_size = info(to).size;
  if (!transpose) {
    return static_cast<size_t>(std::min(rows * cols, conversion_step(out_size))) * out_size;
  }
  return static_cast<size_t>(std::min(transposed_band(out_size, rows), cols) * rows) * out_size;
}

void SafetensorsWriter::write(const fs::path& path) const {
  std::string header = header_json();
  header.resize((header.size() + 7) / 8 * 8, ' ');
  write_file_atomic(path, [&](FileWriter& w) {
    unsigned char len[8];
    for (int i = 0; i < 8; ++i)
      len[i] = static_cast<unsigned char>(uint64_t(header.size()) >> (8 * i));
    w.write(len, 8);
    w.write(header);
    // Conversions and transposes go through a bounded staging buffer, a few rows at a time
    // (staging_bytes), from the staging pool when there is one.
    std::vector<std::byte> heap;
    Allocation pooled;
    auto staging = [&](size_t n) -> std::byte* {
      if (!staging_pool_) {
        heap.resize(n);
        return heap.data();
      }
      pooled = Allocation();  // the last tensor's, freed before the next is taken
      pooled = staging_pool_->allocate(std::max<size_t>(n, 1), Category::staging,
                                       "safetensors.staging");
      return static_cast<std::byte*>(pooled.data());
    };
    // Where each scattered tensor starts in the file (by add_scattered's id), and the bytes the
    // scatter pass has given it.
    struct Region {
      uint64_t at = 0, bytes = 0, got = 0;
    };
    std::vector<Region> regions(items_.size());
    for (const Item* it : ordered()) {
      if (it->scattered) {
        Region& r = regions[static_cast<size_t>(it - items_.data())];
        r.at = w.bytes_written();
        r.bytes = item_bytes(it->dtype, it->shape);
        w.skip(r.bytes);
        continue;
      }
      if (it->source) {
        const uint64_t want = item_bytes(it->dtype, it->shape);
        uint64_t got = 0;
        it->source([&](const void* data, size_t n) {
          MEMFIT_CHECK(got + n <= want, "safetensors", "tensor '{}': its source gave more than {} bytes",
                       it->name, want);
          w.write(data, n);
          got += n;
        });
        MEMFIT_CHECK(got == want, "safetensors", "tensor '{}': its source gave {} of {} bytes",
                     it->name, got, want);
        continue;
      }
      if (it->raw) {
        w.write(it->raw, item_bytes(it->dtype, it->shape));
        continue;
      }
      // A deferred tensor lives from here to the end of this iteration.
      Tensor made;
      if (it->produce) {
        made = it->produce();
        MEMFIT_CHECK(made.defined() && made.is_contiguous() &&
                         made.dtype() == it->source_dtype &&
                         std::vector<int64_t>(made.shape().begin(), made.shape().end()) ==
                             it->source_shape,
                     "safetensors", "tensor '{}' was produced as {} {}, declared {} {}", it->name,
                     dtype_name(made.dtype()), made.shape(), dtype_name(it->source_dtype),
                     format_shape(it->source_shape));
      }
      const Tensor& tensor = it->produce ? made : it->tensor;
      SafetensorsDType from = safetensors_dtype_of(tensor.dtype());
      const auto* src = static_cast<const std::byte*>(tensor.raw_data());
      if (from == it->dtype && !it->transpose) {
        w.write(src, tensor.nbytes());
        continue;
      }
      size_t out_size = info(it->dtype).size;
      if (!it->transpose) {
        int64_t n = tensor.numel();
        const int64_t step = conversion_step(out_size);
        std::byte* chunk = staging(staging_bytes(from, it->dtype, 1, n, false));
        for (int64_t i = 0; i < n; i += step) {
          int64_t k = std::min(step, n - i);
          convert_matrix(src + static_cast<size_t>(i) * info(from).size, from, k, chunk,
                         it->dtype, 1, k, false);
          w.write(chunk, static_cast<size_t>(k) * out_size);
        }
        continue;
      }
      // Stored (cols, rows): each stored row is a source column; a chunk is a band of them.
      int64_t rows = tensor.size(0), cols = tensor.size(1);
      int64_t band = transposed_band(out_size, rows);
      std::byte* chunk = staging(staging_bytes(from, it->dtype, rows, cols, true));
      for (int64_t j = 0; j < cols; j += band) {
        int64_t k = std::min(band, cols - j);
        convert_matrix(src + static_cast<size_t>(j) * info(from).size, from, cols, chunk,
                       it->dtype, rows, k, true);
        w.write(chunk, static_cast<size_t>(k * rows) * out_size);
      }
    }
    bool any_scattered = false;
    for (const Item& it : items_) any_scattered |= it.scattered;
    if (!any_scattered) return;
    MEMFIT_CHECK(scatter_, "safetensors", "{}: scattered tensors and no scatter pass",
                 path.string());
    scatter_([&](size_t id, uint64_t offset, const void* data, size_t n) {
      MEMFIT_CHECK(id < items_.size() && items_[id].scattered, "safetensors",
                   "{}: tensor #{} is not a scattered one", path.string(), id);
      Region& r = regions[id];
      MEMFIT_CHECK(offset <= r.bytes && n <= r.bytes - offset, "safetensors",
                   "tensor '{}': a write of {} bytes at {} lies outside its {} bytes",
                   items_[id].name, n, offset, r.bytes);
      w.write_at(r.at + offset, data, n);
      r.got += n;
    });
    for (size_t i = 0; i < items_.size(); ++i)
      MEMFIT_CHECK(!items_[i].scattered || regions[i].got == regions[i].bytes, "safetensors",
                   "tensor '{}': the scatter pass wrote {} of its {} bytes", items_[i].name,
                   regions[i].got, regions[i].bytes);
  });
}

// ---------------------------------------------------------------------------------------------
// Reader

SafetensorsReader::SafetensorsReader(fs::path path) : path_(std::move(path)) {
  int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail_errno(path_, "cannot open");
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    errno = err;
    fail_errno(path_, "cannot stat");
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    MEMFIT_THROW(IoError, "safetensors", "{}: not a regular file", path_.string());
  }
  file_size_ = static_cast<uint64_t>(st.st_size);
  if (file_size_ > 0) {
    void* p = ::mmap(nullptr, file_size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      int err = errno;
      ::close(fd);
      errno = err;
      fail_errno(path_, "cannot mmap");
    }
    map_ = static_cast<const std::byte*>(p);
  }
  ::close(fd);
  try {
    parse_and_validate();
  } catch (...) {
    unmap();
    throw;
  }
}

SafetensorsReader::~SafetensorsReader() { unmap(); }

void SafetensorsReader::unmap() {
  if (map_) ::munmap(const_cast<std::byte*>(map_), file_size_);
  map_ = nullptr;
}

SafetensorsReader::SafetensorsReader(SafetensorsReader&& o) noexcept { *this = std::move(o); }

SafetensorsReader& SafetensorsReader::operator=(SafetensorsReader&& o) noexcept {
  if (this != &o) {
    unmap();
    path_ = std::move(o.path_);
    map_ = std::exchange(o.map_, nullptr);
    file_size_ = std::exchange(o.file_size_, 0);
    header_size_ = o.header_size_;
    entries_ = std::move(o.entries_);
    index_ = std::move(o.index_);
    metadata_ = std::move(o.metadata_);
  }
  return *this;
}

#define MEMFIT_ST_FAIL(...) \
  MEMFIT_THROW(IoError, "safetensors", "{}: {}", path_.string(), fmt::format(__VA_ARGS__))

void SafetensorsReader::parse_and_validate() {
  if (file_size_ < 8)
    MEMFIT_ST_FAIL("file is {} bytes, too short to hold the 8-byte header length", file_size_);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(map_[i]);
  if (n > kSafetensorsMaxHeader)
    MEMFIT_ST_FAIL("header length {} exceeds the {}-byte limit (corrupt or not safetensors)", n,
                   kSafetensorsMaxHeader);
  if (n > file_size_ - 8)
    MEMFIT_ST_FAIL(
        "header length {} runs past the end of the file ({} bytes, so at most {} bytes "
        "of header; truncated?)",
        n, file_size_, file_size_ - 8);
  header_size_ = n;
  const char* text = reinterpret_cast<const char*>(map_ + 8);
  if (n == 0 || text[0] != '{') MEMFIT_ST_FAIL("header of {} bytes does not start with '{{'", n);

  std::set<std::string> seen;
  std::string duplicate;
  auto on_event = [&](int depth, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::key && depth == 1) {
      std::string key = parsed.get<std::string>();
      if (!seen.insert(key).second && duplicate.empty()) duplicate = key;
    }
    return true;
  };
  json header;
  try {
    header = json::parse(text, text + n, on_event);
  } catch (const json::exception& e) {
    MEMFIT_ST_FAIL("header is not valid JSON: {}", e.what());
  }
  if (!header.is_object())
    MEMFIT_ST_FAIL("header must be a JSON object, got {}", header.type_name());
  if (!duplicate.empty()) MEMFIT_ST_FAIL("'{}' appears twice in the header", duplicate);

  const uint64_t data_size = file_size_ - 8 - n;
  for (auto& [key, value] : header.items()) {
    if (key == "__metadata__") {
      if (!value.is_object())
        MEMFIT_ST_FAIL("__metadata__ must be an object of strings, got {}", value.type_name());
      for (auto& [k, v] : value.items()) {
        if (!v.is_string())
          MEMFIT_ST_FAIL("__metadata__ '{}' must be a string, got {}", k, v.dump());
        metadata_[k] = v.get<std::string>();
      }
      continue;
    }
    auto bad = [&](const std::string& what) { MEMFIT_ST_FAIL("tensor '{}': {}", key, what); };
    if (!value.is_object()) bad(fmt::format("entry must be an object, got {}", value.dump()));
    for (const char* field : {"dtype", "shape", "data_offsets"})
      if (!value.contains(field)) bad(fmt::format("missing \"{}\"", field));
    const json& jd = value["dtype"];
    std::optional<SafetensorsDType> dtype =
        jd.is_string() ? safetensors_dtype_parse(jd.get<std::string>()) : std::nullopt;
    if (!dtype) bad(fmt::format("unknown dtype {} (known: {})", jd.dump(), known_dtype_names()));
    SafetensorsEntry e;
    e.name = key;
    e.dtype = *dtype;
    const json& js = value["shape"];
    if (!js.is_array()) bad(fmt::format("shape must be an array, got {}", js.dump()));
    uint64_t bytes = info(e.dtype).size;
    bool overflow = false;
    for (const json& d : js) {
      if (!d.is_number_unsigned() || d.get<uint64_t>() > uint64_t(INT64_MAX))
        bad(fmt::format("shape {} must hold non-negative integers", js.dump()));
      uint64_t dim = d.get<uint64_t>();
      e.shape.push_back(static_cast<int64_t>(dim));
      overflow |= __builtin_mul_overflow(bytes, dim, &bytes);
    }
    const json& jo = value["data_offsets"];
    if (!jo.is_array() || jo.size() != 2 || !jo[0].is_number_unsigned() ||
        !jo[1].is_number_unsigned() || jo[0].get<uint64_t>() > jo[1].get<uint64_t>())
      bad(fmt::format("data_offsets must be [begin, end] with 0 <= begin <= end, got {}",
                      jo.dump()));
    e.begin = jo[0].get<uint64_t>();
    e.end = jo[1].get<uint64_t>();
    if (overflow || bytes != e.end - e.begin)
      bad(fmt::format("dtype {} and shape {} need {} bytes, but data_offsets [{}, {}] hold {}",
                      info(e.dtype).name, format_shape(e.shape),
                      overflow ? std::string("more than 2^64") : std::to_string(bytes), e.begin,
                      e.end, e.end - e.begin));
    if (e.end > data_size)
      bad(fmt::format("data_offsets [{}, {}] run past the data section ({} bytes; truncated file?)",
                      e.begin, e.end, data_size));
    entries_.push_back(std::move(e));
  }

  // The tensors must tile the data section: sorted by offset, each begins where the last ended.
  std::sort(entries_.begin(), entries_.end(),
            [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
              return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
            });
  uint64_t cursor = 0;
  const SafetensorsEntry* prev = nullptr;
  for (const SafetensorsEntry& e : entries_) {
    if (e.begin < cursor)
      MEMFIT_ST_FAIL("tensor '{}': data_offsets [{}, {}] overlap tensor '{}' [{}, {}]", e.name,
                     e.begin, e.end, prev->name, prev->begin, prev->end);
    if (e.begin > cursor)
      MEMFIT_ST_FAIL(
          "tensor '{}': data_offsets [{}, {}] leave a hole: bytes [{}, {}) of the data "
          "section belong to no tensor{}",
          e.name, e.begin, e.end, cursor, e.begin,
          prev ? fmt::format(" (after tensor '{}')", prev->name) : std::string());
    cursor = e.end;
    prev = &e;
  }
  if (cursor != data_size)
    MEMFIT_ST_FAIL("bytes [{}, {}) at the end of the data section belong to no tensor{}", cursor,
                   data_size,
                   prev ? fmt::format(" (after tensor '{}')", prev->name) : std::string());
  for (size_t i = 0; i < entries_.size(); ++i) index_[entries_[i].name] = i;
}

const SafetensorsEntry* SafetensorsReader::find(std::string_view name) const {
  auto it = index_.find(std::string(name));
  return it == index_.end() ? nullptr : &entries_[it->second];
}

const SafetensorsEntry& SafetensorsReader::at(std::string_view name) const {
  const SafetensorsEntry* e = find(name);
  if (!e) MEMFIT_ST_FAIL("no tensor '{}' in this file ({} tensors)", name, entries_.size());
  return *e;
}

const std::byte* SafetensorsReader::bytes(const SafetensorsEntry& e) const {
  return map_ + data_offset() + e.begin;
}

void SafetensorsReader::read(const SafetensorsEntry& e, const Tensor& dst, bool transpose) const {
  if (!dst.defined() || !dst.is_contiguous())
    MEMFIT_ST_FAIL("tensor '{}': destination must be a defined, contiguous tensor", e.name);
  SafetensorsDType to = safetensors_dtype_of(dst.dtype());
  if (!can_convert(e.dtype, to))
    MEMFIT_ST_FAIL("tensor '{}': stored as {}, which cannot be read into a {} tensor", e.name,
                   info(e.dtype).name, dtype_name(dst.dtype()));
  std::vector<int64_t> want(dst.shape().begin(), dst.shape().end());
  if (transpose) {
    if (e.shape.size() != 2 || want.size() != 2)
      MEMFIT_ST_FAIL("tensor '{}': a transposed read needs 2-D tensors, stored {} into {}", e.name,
                     format_shape(e.shape), dst.shape());
    std::swap(want[0], want[1]);
  }
  if (e.shape != want)
    MEMFIT_ST_FAIL("tensor '{}': stored shape {} does not fit destination {}{}", e.name,
                   format_shape(e.shape), dst.shape(), transpose ? " (transposed)" : "");
  auto* out = static_cast<std::byte*>(dst.raw_data());
  if (transpose) {
    convert_matrix(bytes(e), e.dtype, e.shape[1], out, to, e.shape[0], e.shape[1], true);
    return;
  }
  // In pieces of 4 MiB of the file, each piece's pages released once converted: reading a
  // tensor holds one piece of its file in RAM, not the whole tensor (a 7B embedding is 262 MB).
  const int64_t n = e.numel(), step = conversion_step(info(e.dtype).size);
  const size_t in = info(e.dtype).size, o = dtype_size(dst.dtype());
  for (int64_t i = 0; i < n; i += step) {
    const int64_t k = std::min(step, n - i);
    convert_matrix(bytes(e) + i * in, e.dtype, k, out + i * o, to, 1, k, false);
    release_before(e, static_cast<uint64_t>(i + k) * in);
  }
}

void SafetensorsReader::release(const SafetensorsEntry& e) const { release_before(e, e.nbytes()); }

void SafetensorsReader::release_before(const SafetensorsEntry& e, uint64_t end) const {
  static const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto at = reinterpret_cast<uintptr_t>(bytes(e));
  const uintptr_t first = (at + page - 1) / page * page;
  const uintptr_t last = (at + std::min<uint64_t>(end, e.nbytes())) / page * page;
  if (last > first)  // advice only: a failure changes nothing the caller can see
    (void)::madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);
}

#undef MEMFIT_ST_FAIL

}  // namespace memfit::io
