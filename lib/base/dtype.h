// Datatype and reduction-op tables: sizes, names, parsing; and the one datatype -> C++ type
// dispatch of the library (host kernels, device kernels, tests and benchmarks all use it).
#ifndef MTXCOMM_LIB_DTYPE_H_
#define MTXCOMM_LIB_DTYPE_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

#include "lib/base/error.h"
#include "mtxcomm/mtxcomm.h"

namespace mtxcomm {

bool isValidDatatype(mtxcomm_datatype_t dt);
bool isValidOp(mtxcomm_op_t op);
// Bytes per element; 0 for an invalid datatype.
size_t datatypeSize(mtxcomm_datatype_t dt);
// "int8", "uint8", "int32", "uint32", "int64", "uint64", "float16", "bfloat16", "float32",
// "float64", "int16", "uint16", "bool"; "invalid" otherwise.
const char* datatypeName(mtxcomm_datatype_t dt);
// "sum", "prod", "min", "max", "avg", "adasum"; "invalid" otherwise.
const char* opName(mtxcomm_op_t op);
// Inverse of datatypeName (also accepts "int", "float", "double", "half", "bf16").
std::optional<mtxcomm_datatype_t> parseDatatype(std::string_view name);
std::optional<mtxcomm_op_t> parseOp(std::string_view name);
bool isFloatingType(mtxcomm_datatype_t dt);
// float16 and bfloat16: reduced in float32 (the collective layer widens them).
inline bool isHalfType(mtxcomm_datatype_t dt) {
  return dt == MTXCOMM_FLOAT16 || dt == MTXCOMM_BFLOAT16;
}
// bool: one byte, 0 false, any other byte true; reductions are logical (SUM/MAX = OR,
// PROD/MIN = AND) and write 0 or 1.
inline bool isBoolType(mtxcomm_datatype_t dt) { return dt == MTXCOMM_BOOL; }
// Why op cannot reduce dt (a message naming both), or nullptr when it can: AVG on bool, ADASUM
// on anything but float16, bfloat16, float32 and float64. For valid op and dt.
const char* opDeclinesDatatype(mtxcomm_op_t op, mtxcomm_datatype_t dt);

// The storage types of the 16-bit floats in dispatchDatatype: their bits.
struct Float16Bits {
  uint16_t bits;
};
struct Bfloat16Bits {
  uint16_t bits;
};
static_assert(sizeof(Float16Bits) == 2 && sizeof(Bfloat16Bits) == 2, "16-bit storage");
// The storage type of bool in dispatchDatatype: its byte (any value; nonzero is true). A type
// of its own so that dispatch keeps it apart from uint8.
struct BoolByte {
  uint8_t byte;
};
static_assert(sizeof(BoolByte) == 1, "bool is one byte");

template <class T>
struct TypeTag {
  using type = T;
};

// Calls f(TypeTag<T>{}) with T the storage type of dt — int8_t, uint8_t, int32_t, uint32_t,
// int64_t, uint64_t, Float16Bits, Bfloat16Bits, float, double, int16_t, uint16_t, BoolByte —
// and returns what f returns.
// Throws MTXCOMM_INVALID_ARGUMENT for an invalid datatype.
template <class F>
decltype(auto) dispatchDatatype(mtxcomm_datatype_t dt, F&& f) {
  switch (dt) {
    case MTXCOMM_INT8:
      return f(TypeTag<int8_t>{});
    case MTXCOMM_UINT8:
      return f(TypeTag<uint8_t>{});
    case MTXCOMM_INT32:
      return f(TypeTag<int32_t>{});
    case MTXCOMM_UINT32:
      return f(TypeTag<uint32_t>{});
    case MTXCOMM_INT64:
      return f(TypeTag<int64_t>{});
    case MTXCOMM_UINT64:
      return f(TypeTag<uint64_t>{});
    case MTXCOMM_FLOAT16:
      return f(TypeTag<Float16Bits>{});
    case MTXCOMM_BFLOAT16:
      return f(TypeTag<Bfloat16Bits>{});
    case MTXCOMM_FLOAT32:
      return f(TypeTag<float>{});
    case MTXCOMM_FLOAT64:
      return f(TypeTag<double>{});
    case MTXCOMM_INT16:
      return f(TypeTag<int16_t>{});
    case MTXCOMM_UINT16:
      return f(TypeTag<uint16_t>{});
    case MTXCOMM_BOOL:
      return f(TypeTag<BoolByte>{});
    default:
      break;
  }
  fail(MTXCOMM_INVALID_ARGUMENT, "invalid datatype ", static_cast<int>(dt));
}

}  // namespace mtxcomm

#endif  // MTXCOMM_LIB_DTYPE_H_
