// Closed-form inputs and expected results of the device-buffer tests (tests/gpu) and of
// mtxcomm_gpu_bench -c: rank r's element i is a small integer, exact in every datatype, so
// every rank checks its own result.
#ifndef MTXCOMM_TESTS_COMMON_GPU_DATA_H_
#define MTXCOMM_TESTS_COMMON_GPU_DATA_H_

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "algos/registry.h"
#include "lib/dtype.h"
#include "lib/reduce.h"
#include "mtxcomm/mtxcomm.h"

namespace mtxcomm {
namespace gpudata {

inline double input(int r, size_t i) {
  return 1 + static_cast<double>((3 * static_cast<size_t>(r) + i) % 5);
}

// The value the collective's reduction gives at element i of n ranks' inputs, as dt holds it.
inline double reduced(mtxcomm_op_t op, mtxcomm_datatype_t dt, int n, size_t i) {
  double acc = input(0, i);
  for (int r = 1; r < n; ++r) {
    const double v = input(r, i);
    acc = op == MTXCOMM_PROD  ? acc * v
          : op == MTXCOMM_MIN ? std::min(acc, v)
          : op == MTXCOMM_MAX ? std::max(acc, v)
                              : acc + v;
  }
  if (op == MTXCOMM_AVG) {
    acc /= n;
    if (!isFloatingType(dt)) acc = std::trunc(acc);
    if (dt == MTXCOMM_FLOAT16) acc = halfToFloat(floatToHalf(static_cast<float>(acc)));
    if (dt == MTXCOMM_BFLOAT16) acc = bfloat16ToFloat(floatToBfloat16(static_cast<float>(acc)));
    if (dt == MTXCOMM_FLOAT32) acc = static_cast<float>(acc);
  }
  return acc;
}

inline double load(mtxcomm_datatype_t dt, const void* base, size_t i) {
  const auto* p = static_cast<const unsigned char*>(base) + i * datatypeSize(dt);
  switch (dt) {
    case MTXCOMM_INT8:
      return *reinterpret_cast<const int8_t*>(p);
    case MTXCOMM_UINT8:
      return *p;
    case MTXCOMM_INT32:
      return *reinterpret_cast<const int32_t*>(p);
    case MTXCOMM_UINT32:
      return *reinterpret_cast<const uint32_t*>(p);
    case MTXCOMM_INT64:
      return static_cast<double>(*reinterpret_cast<const int64_t*>(p));
    case MTXCOMM_UINT64:
      return static_cast<double>(*reinterpret_cast<const uint64_t*>(p));
    case MTXCOMM_FLOAT16:
      return halfToFloat(*reinterpret_cast<const uint16_t*>(p));
    case MTXCOMM_BFLOAT16:
      return bfloat16ToFloat(*reinterpret_cast<const uint16_t*>(p));
    case MTXCOMM_FLOAT32:
      return *reinterpret_cast<const float*>(p);
    default:
      return *reinterpret_cast<const double*>(p);
  }
}

inline void store(mtxcomm_datatype_t dt, void* base, size_t i, double v) {
  auto* p = static_cast<unsigned char*>(base) + i * datatypeSize(dt);
  switch (dt) {
    case MTXCOMM_INT8:
      *reinterpret_cast<int8_t*>(p) = static_cast<int8_t>(v);
      break;
    case MTXCOMM_UINT8:
      *p = static_cast<uint8_t>(v);
      break;
    case MTXCOMM_INT32:
      *reinterpret_cast<int32_t*>(p) = static_cast<int32_t>(v);
      break;
    case MTXCOMM_UINT32:
      *reinterpret_cast<uint32_t*>(p) = static_cast<uint32_t>(v);
      break;
    case MTXCOMM_INT64:
      *reinterpret_cast<int64_t*>(p) = static_cast<int64_t>(v);
      break;
    case MTXCOMM_UINT64:
      *reinterpret_cast<uint64_t*>(p) = static_cast<uint64_t>(v);
      break;
    case MTXCOMM_FLOAT16:
      *reinterpret_cast<uint16_t*>(p) = floatToHalf(static_cast<float>(v));
      break;
    case MTXCOMM_BFLOAT16:
      *reinterpret_cast<uint16_t*>(p) = floatToBfloat16(static_cast<float>(v));
      break;
    case MTXCOMM_FLOAT32:
      *reinterpret_cast<float*>(p) = static_cast<float>(v);
      break;
    default:
      *reinterpret_cast<double*>(p) = v;
  }
}

// Expected element i of rank's recvbuf (count: the call's count argument).
inline double expected(Collective c, mtxcomm_op_t op, mtxcomm_datatype_t dt, int n, int rank,
                       int root, size_t count, size_t i) {
  switch (c) {
    case Collective::kBroadcast:
      return input(root, i);
    case Collective::kAllgather:
      return input(static_cast<int>(i / count), i % count);
    case Collective::kReduceScatter:
      return reduced(op, dt, n, static_cast<size_t>(rank) * count + i);
    default:
      return reduced(op, dt, n, i);
  }
}

}  // namespace gpudata
}  // namespace mtxcomm

#endif  // MTXCOMM_TESTS_COMMON_GPU_DATA_H_
