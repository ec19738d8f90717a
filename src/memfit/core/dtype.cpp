#include "memfit/core/dtype.h"

namespace memfit {

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::f32: return 4;
    case DType::bf16: return 2;
    case DType::f16: return 2;
    case DType::i8: return 1;
    case DType::i32: return 4;
    case DType::u16: return 2;
    case DType::u8: return 1;
  }
  return 0;
}

std::string_view dtype_name(DType dtype) {
  switch (dtype) {
    case DType::f32: return "f32";
    case DType::bf16: return "bf16";
    case DType::f16: return "f16";
    case DType::i8: return "i8";
    case DType::i32: return "i32";
    case DType::u16: return "u16";
    case DType::u8: return "u8";
  }
  return "?";
}

}  // namespace memfit
