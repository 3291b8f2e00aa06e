// The TcpStore's request framing (lib/comm/tcp_store_server.h has the protocol), as a pure function
// of the bytes a client sent: the server parses with it, and tests/fuzz/fuzz_store_request.cc
// feeds it arbitrary bytes.
#ifndef MTXCOMM_LIB_COMM_STORE_WIRE_H_
#define MTXCOMM_LIB_COMM_STORE_WIRE_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace mtxcomm {

constexpr uint8_t kStoreOpSet = 1;
constexpr uint8_t kStoreOpGet = 2;
constexpr uint8_t kStoreOpCheck = 3;
constexpr uint64_t kStoreMaxKeyBytes = 4096;
constexpr uint64_t kStoreMaxValueBytes = 64ull << 20;

struct StoreRequest {
  uint8_t op = 0;
  uint64_t keyBytes = 0;    // set for kBadOp / kKeyTooLong too
  uint64_t valueBytes = 0;  // set for kValueTooLong too
  std::string_view key;     // views into the parsed bytes
  std::string_view value;   // SET only
  size_t used = 0;          // bytes of the request (kRequest)
};

enum class StoreParse {
  kIncomplete,    // a prefix of a request: wait for more bytes
  kRequest,       // *req is one request of req->used bytes
  kBadOp,         // not SET, GET or CHECK: drop the client
  kKeyTooLong,    // over kStoreMaxKeyBytes: drop the client
  kValueTooLong,  // over kStoreMaxValueBytes: drop the client
};

// Parses the first request of in: u8 op, u64 key length, key, and for SET u64 value length,
// value (host byte order). Never reads past in, never allocates.
inline StoreParse parseStoreRequest(std::string_view in, StoreRequest* req) {
  *req = StoreRequest();
  size_t p = 0;
  auto take = [&](void* dst, size_t n) {
    if (in.size() - p < n) return false;
    std::memcpy(dst, in.data() + p, n);
    p += n;
    return true;
  };
  if (!take(&req->op, 1) || !take(&req->keyBytes, 8)) return StoreParse::kIncomplete;
  if (req->op != kStoreOpSet && req->op != kStoreOpGet && req->op != kStoreOpCheck) {
    return StoreParse::kBadOp;
  }
  if (req->keyBytes > kStoreMaxKeyBytes) return StoreParse::kKeyTooLong;
  if (in.size() - p < req->keyBytes) return StoreParse::kIncomplete;
  req->key = in.substr(p, req->keyBytes);
  p += req->keyBytes;
  if (req->op == kStoreOpSet) {
    if (!take(&req->valueBytes, 8)) return StoreParse::kIncomplete;
    if (req->valueBytes > kStoreMaxValueBytes) return StoreParse::kValueTooLong;
    if (in.size() - p < req->valueBytes) return StoreParse::kIncomplete;
    req->value = in.substr(p, req->valueBytes);
    p += req->valueBytes;
  }
  req->used = p;
  return StoreParse::kRequest;
}

}  // namespace mtxcomm

#endif  // MTXCOMM_LIB_COMM_STORE_WIRE_H_
