#include "bindings/common/request.h"

#include <sstream>

namespace mtxcomm::binding {

const char* kindName(Kind k) {
  switch (k) {
    case Kind::kAllreduce:
      return "allreduce";
    case Kind::kAllgather:
      return "allgather";
    case Kind::kBroadcast:
      return "broadcast";
    case Kind::kReduceScatter:
      return "reducescatter";
    case Kind::kJoin:
      return "join";
    case Kind::kAlltoall:
      return "alltoall";
  }
  return "?";
}

size_t TensorMeta::elements() const {
  size_t n = 1;
  for (int64_t d : shape) n *= static_cast<size_t>(d);
  return n;
}

namespace {

const char* dtypeName(mtxcomm_datatype_t t) {
  // Indexed by mtxcomm_datatype_t (the bindings see the public API only, not lib/base/dtype.h).
  static constexpr const char* kNames[] = {"int8",   "uint8",   "int32",    "uint32",  "int64",
                                           "uint64", "float16", "bfloat16", "float32", "float64",
                                           "int16",  "uint16",  "bool"};
  static_assert(sizeof(kNames) / sizeof(kNames[0]) == MTXCOMM_NUM_DATATYPES,
                "a name for every datatype");
  return t >= 0 && t < MTXCOMM_NUM_DATATYPES ? kNames[t] : "?";
}

const char* opName(mtxcomm_op_t op) {
  static const char* kNames[] = {"sum", "prod", "min", "max", "avg", "adasum"};
  static_assert(sizeof(kNames) / sizeof(kNames[0]) == MTXCOMM_NUM_OPS, "one name per op");
  return op >= 0 && op < MTXCOMM_NUM_OPS ? kNames[op] : "?";
}

std::string describeTensors(const Request& r) {
  std::ostringstream s;
  for (size_t i = 0; i < r.tensors.size(); ++i) {
    s << (i ? ", " : "") << dtypeName(r.tensors[i].dtype) << "[";
    for (size_t d = 0; d < r.tensors[i].shape.size(); ++d) {
      s << (d ? "," : "") << r.tensors[i].shape[d];
    }
    s << "]";
  }
  return s.str();
}

}  // namespace

std::string describeRequest(const Request& r) {
  if (r.kind == Kind::kAllreduce && r.root == kRefusedRoot) {
    return "a call it refused before sending anything (its own arguments; its error says why)";
  }
  std::ostringstream s;
  s << kindName(r.kind);
  if (r.kind == Kind::kAllreduce || r.kind == Kind::kReduceScatter) s << "(" << opName(r.op) << ")";
  if (r.kind == Kind::kBroadcast) s << "(root " << r.root << ")";
  s << " of " << describeTensors(r);
  if (r.kind == Kind::kAlltoall && !r.splits.empty()) {
    s << " with splits [";
    for (size_t i = 0; i < r.splits.size(); ++i) s << (i ? "," : "") << r.splits[i];
    s << "]";
  }
  if (r.device != kHostDevice) s << " on " << deviceName(r.device);
  return s.str();
}

std::string rankList(const std::vector<int>& ranks) {
  std::ostringstream s;
  s << (ranks.size() == 1 ? "rank " : "ranks ");
  for (size_t i = 0; i < ranks.size(); ++i) s << (i ? "," : "") << ranks[i];
  return s.str();
}

std::string deviceName(int32_t device) {
  return device == kHostDevice ? "host memory" : "cuda:" + std::to_string(device);
}

void writeRequest(Writer& w, const Request& r) {
  w.put<uint8_t>(static_cast<uint8_t>(r.kind));
  w.put<uint8_t>(static_cast<uint8_t>(r.op));
  w.put<int32_t>(r.root);
  w.put<int32_t>(r.device);
  w.putString(r.name);
  w.put<uint32_t>(static_cast<uint32_t>(r.tensors.size()));
  for (const TensorMeta& t : r.tensors) {
    w.put<uint8_t>(static_cast<uint8_t>(t.dtype));
    w.put<uint32_t>(static_cast<uint32_t>(t.shape.size()));
    for (int64_t d : t.shape) w.put<int64_t>(d);
  }
  if (r.kind == Kind::kAlltoall) {
    w.put<uint32_t>(static_cast<uint32_t>(r.splits.size()));
    for (int64_t s : r.splits) w.put<int64_t>(s);
  }
}

Request readRequest(Reader& rd) {
  constexpr uint32_t kMaxTensors = 1 << 20, kMaxDims = 64;
  Request r;
  const uint8_t kind = rd.get<uint8_t>();
  const uint8_t op = rd.get<uint8_t>();
  if (kind >= kNumKinds || op >= MTXCOMM_NUM_OPS) throw std::runtime_error("bad request kind/op");
  r.kind = static_cast<Kind>(kind);
  r.op = static_cast<mtxcomm_op_t>(op);
  r.root = rd.get<int32_t>();
  r.device = rd.get<int32_t>();
  if (r.device < kHostDevice || r.device >= (1 << 16))
    throw std::runtime_error("bad request device");
  r.name = rd.getString();
  uint32_t nt = rd.get<uint32_t>();
  // Each tensor takes at least 5 bytes (dtype, rank): no allocation beyond what the message holds.
  if (nt > kMaxTensors || nt > rd.remaining() / 5) {
    throw std::runtime_error("bad request: too many tensors");
  }
  r.tensors.resize(nt);
  for (TensorMeta& t : r.tensors) {
    const uint8_t dt = rd.get<uint8_t>();
    if (dt >= MTXCOMM_NUM_DATATYPES) throw std::runtime_error("bad request datatype");
    t.dtype = static_cast<mtxcomm_datatype_t>(dt);
    uint32_t nd = rd.get<uint32_t>();
    if (nd > kMaxDims) throw std::runtime_error("bad request: too many dimensions");
    t.shape.resize(nd);
    for (int64_t& d : t.shape) {
      d = rd.get<int64_t>();
      if (d < 0) throw std::runtime_error("bad request: negative dimension");
    }
  }
  if (r.kind == Kind::kAlltoall) {
    // Values are checked by Negotiation::check (every rank reports a bad split the same way).
    const uint32_t ns = rd.get<uint32_t>();
    if (ns > rd.remaining() / sizeof(int64_t)) throw std::runtime_error("bad request: splits");
    r.splits.resize(ns);
    for (int64_t& s : r.splits) s = rd.get<int64_t>();
  }
  return r;
}

}  // namespace mtxcomm::binding
