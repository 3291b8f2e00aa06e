// Datatype and reduction-op tables: sizes, names, parsing.
#ifndef MTXCOMM_LIB_DTYPE_H_
#define MTXCOMM_LIB_DTYPE_H_

#include <cstddef>
#include <optional>
#include <string_view>

#include "mtxcomm/mtxcomm.h"

namespace mtxcomm {

bool isValidDatatype(mtxcomm_datatype_t dt);
bool isValidOp(mtxcomm_op_t op);
// Bytes per element; 0 for an invalid datatype.
size_t datatypeSize(mtxcomm_datatype_t dt);
// "int8", "uint8", "int32", "uint32", "int64", "uint64", "float16", "bfloat16", "float32",
// "float64"; "invalid" otherwise.
const char* datatypeName(mtxcomm_datatype_t dt);
// "sum", "prod", "min", "max", "avg"; "invalid" otherwise.
const char* opName(mtxcomm_op_t op);
// Inverse of datatypeName (also accepts "int", "float", "double", "half", "bf16").
std::optional<mtxcomm_datatype_t> parseDatatype(std::string_view name);
std::optional<mtxcomm_op_t> parseOp(std::string_view name);
bool isFloatingType(mtxcomm_datatype_t dt);
// float16 and bfloat16: reduced in float32 (the collective layer widens them).
inline bool isHalfType(mtxcomm_datatype_t dt) {
  return dt == MTXCOMM_FLOAT16 || dt == MTXCOMM_BFLOAT16;
}

}  // namespace mtxcomm

#endif  // MTXCOMM_LIB_DTYPE_H_
