// Datatype and reduction-op tables (see dtype.h).
#include "lib/base/dtype.h"

#include <array>
#include <string>

namespace mtxcomm {
namespace {

struct DatatypeInfo {
  const char* name;
  size_t size;
  bool floating;
};

// Indexed by mtxcomm_datatype_t.
constexpr std::array<DatatypeInfo, MTXCOMM_NUM_DATATYPES> kDatatypes = {{
    {"int8", 1, false},
    {"uint8", 1, false},
    {"int32", 4, false},
    {"uint32", 4, false},
    {"int64", 8, false},
    {"uint64", 8, false},
    {"float16", 2, true},
    {"bfloat16", 2, true},
    {"float32", 4, true},
    {"float64", 8, true},
    {"int16", 2, false},
    {"uint16", 2, false},
    {"bool", 1, false},
}};
static_assert(kDatatypes[MTXCOMM_NUM_DATATYPES - 1].name != nullptr,
              "kDatatypes has a row for every mtxcomm_datatype_t");

// Indexed by mtxcomm_op_t.
constexpr std::array<const char*, MTXCOMM_NUM_OPS> kOpNames = {"sum", "prod", "min",
                                                               "max", "avg",  "adasum"};

struct Alias {
  std::string_view name;
  mtxcomm_datatype_t dt;
};
constexpr std::array<Alias, 5> kDatatypeAliases = {{
    {"int", MTXCOMM_INT32},
    {"float", MTXCOMM_FLOAT32},
    {"double", MTXCOMM_FLOAT64},
    {"half", MTXCOMM_FLOAT16},
    {"bf16", MTXCOMM_BFLOAT16},
}};

}  // namespace

bool isValidDatatype(mtxcomm_datatype_t dt) {
  return static_cast<int>(dt) >= 0 && static_cast<int>(dt) < MTXCOMM_NUM_DATATYPES;
}

bool isValidOp(mtxcomm_op_t op) {
  return static_cast<int>(op) >= 0 && static_cast<int>(op) < MTXCOMM_NUM_OPS;
}

size_t datatypeSize(mtxcomm_datatype_t dt) { return isValidDatatype(dt) ? kDatatypes[dt].size : 0; }

const char* datatypeName(mtxcomm_datatype_t dt) {
  return isValidDatatype(dt) ? kDatatypes[dt].name : "invalid";
}

const char* opName(mtxcomm_op_t op) {
  if (!isValidOp(op)) return "invalid";
  return kOpNames[op];  // cppcheck-suppress CastIntegerToAddressAtReturn
}

std::optional<mtxcomm_datatype_t> parseDatatype(std::string_view name) {
  for (int i = 0; i < MTXCOMM_NUM_DATATYPES; ++i) {
    if (name == kDatatypes[i].name) return static_cast<mtxcomm_datatype_t>(i);
  }
  for (const Alias& a : kDatatypeAliases) {
    if (name == a.name) return a.dt;
  }
  return std::nullopt;
}

std::optional<mtxcomm_op_t> parseOp(std::string_view name) {
  for (int i = 0; i < MTXCOMM_NUM_OPS; ++i) {
    if (name == kOpNames[i]) return static_cast<mtxcomm_op_t>(i);
  }
  return std::nullopt;
}

bool isFloatingType(mtxcomm_datatype_t dt) {
  return isValidDatatype(dt) && kDatatypes[dt].floating;
}

const char* opDeclinesDatatype(mtxcomm_op_t op, mtxcomm_datatype_t dt) {
  if (op == MTXCOMM_AVG && isBoolType(dt)) {
    return "op avg is not defined for datatype bool (bool reductions are logical: sum and max "
           "are OR, prod and min are AND)";
  }
  if (op == MTXCOMM_ADASUM && isValidDatatype(dt) && !isFloatingType(dt)) {
    // One message per datatype, naming it (the return type is a C string).
    static const std::array<std::string, MTXCOMM_NUM_DATATYPES> kAdasum = [] {
      std::array<std::string, MTXCOMM_NUM_DATATYPES> m;
      for (int i = 0; i < MTXCOMM_NUM_DATATYPES; ++i) {
        m[i] = std::string("op adasum is not defined for datatype ") + kDatatypes[i].name +
               " (adasum takes float16, bfloat16, float32 or float64)";
      }
      return m;
    }();
    return kAdasum[dt].c_str();
  }
  return nullptr;
}

}  // namespace mtxcomm
