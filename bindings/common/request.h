// The engine's requests: what a framework submits for one named collective (kind, op, root,
// dtypes and shapes), how they are written to and read from the negotiation messages, and how
// they are described in errors. TF-free (bindings/common).
#ifndef MTXCOMM_BINDINGS_COMMON_REQUEST_H_
#define MTXCOMM_BINDINGS_COMMON_REQUEST_H_

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "mtxcomm/mtxcomm.h"

namespace mtxcomm::binding {

// kJoin: the rank has run out of work (join()); see negotiation.h. kAlltoall: rows of
// dimension 0 scattered to the ranks by Request::splits (mtxcomm_alltoallv).
enum class Kind : uint8_t {
  kAllreduce = 0,
  kAllgather = 1,
  kBroadcast = 2,
  kReduceScatter = 3,
  kJoin = 4,
  kAlltoall = 5
};
constexpr uint8_t kNumKinds = 6;
const char* kindName(Kind k);

struct TensorMeta {
  mtxcomm_datatype_t dtype = MTXCOMM_FLOAT32;
  std::vector<int64_t> shape;
  size_t elements() const;
  size_t bytes() const { return elements() * mtxcomm_datatype_size(dtype); }
  bool operator==(const TensorMeta& o) const { return dtype == o.dtype && shape == o.shape; }
};

struct Request {
  Kind kind = Kind::kAllreduce;
  std::string name;
  mtxcomm_op_t op = MTXCOMM_SUM;    // allreduce, reduce-scatter
  int root = 0;                     // broadcast
  std::vector<TensorMeta> tensors;  // one, or several for a grouped allreduce/allgather/
                                    // reduce-scatter
  // Alltoall: rows of dimension 0 this rank sends to each rank, in rank order (size() entries,
  // summing to dimension 0); empty: dimension 0 split evenly.
  std::vector<int64_t> splits;
  // Where the tensors live: kHostDevice (host memory) or CUDA device N (the entry's buffers
  // are device memory; the collective is enqueued on Entry::stream). Every rank's must agree.
  int32_t device = -1;
  bool operator==(const Request& o) const {
    return kind == o.kind && name == o.name && op == o.op && root == o.root &&
           tensors == o.tensors && splits == o.splits && device == o.device;
  }
};

// Request::device of host memory.
constexpr int32_t kHostDevice = -1;
// "host memory" or "cuda:N".
std::string deviceName(int32_t device);

struct Status {
  mtxcomm_result_t code = MTXCOMM_SUCCESS;
  std::string message;
  bool ok() const { return code == MTXCOMM_SUCCESS; }
};

// The root of the request a rank submits in place of a call it refused before submitting
// (its own bad arguments: the torch backend's placeholder, an allreduce of int8[0]), so that
// the others' call fails at once: allreduce has no root, no real call sets it.
constexpr int kRefusedRoot = -1;

// "allreduce(sum) of float32[2,3]", for errors; "a call it refused ..." for a placeholder.
std::string describeRequest(const Request& r);
// "rank 3" or "ranks 1,2".
std::string rankList(const std::vector<int>& ranks);

// The wire format of one cycle's message, host byte order (every rank runs the same build).
// A Reader throws std::runtime_error on a truncated message.
class Writer {
 public:
  template <class T>
  void put(T v) {
    const char* p = reinterpret_cast<const char*>(&v);
    buf_.insert(buf_.end(), p, p + sizeof(T));
  }
  void putString(const std::string& s) {
    put<uint32_t>(static_cast<uint32_t>(s.size()));
    buf_.insert(buf_.end(), s.begin(), s.end());
  }
  std::vector<char>& bytes() { return buf_; }

 private:
  std::vector<char> buf_;
};

class Reader {
 public:
  Reader(const char* p, size_t n) : p_(p), end_(p + n) {}
  template <class T>
  T get() {
    T v;
    need(sizeof(T));
    std::memcpy(&v, p_, sizeof(T));
    p_ += sizeof(T);
    return v;
  }
  std::string getString() {
    uint32_t n = get<uint32_t>();
    need(n);
    std::string s(p_, n);
    p_ += n;
    return s;
  }
  size_t remaining() const { return static_cast<size_t>(end_ - p_); }

 private:
  void need(size_t n) {
    if (static_cast<size_t>(end_ - p_) < n) throw std::runtime_error("truncated request message");
  }
  const char* p_;
  const char* end_;
};

void writeRequest(Writer& w, const Request& r);
// Throws std::runtime_error on a malformed request (a kind, dtype or op out of range, more
// dimensions or tensors than any framework makes).
Request readRequest(Reader& rd);

}  // namespace mtxcomm::binding

#endif  // MTXCOMM_BINDINGS_COMMON_REQUEST_H_
