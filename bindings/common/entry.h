// What a framework submits to the engine (engine.h): one request with its buffers and
// callbacks. The framework side (bindings/tensorflow/, bindings/python/ for the array API, a
// future bindings/torch/) fills it; the engine's parts (executor.h) run it.
#ifndef MTXCOMM_BINDINGS_COMMON_ENTRY_H_
#define MTXCOMM_BINDINGS_COMMON_ENTRY_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "bindings/common/request.h"

namespace mtxcomm::binding {

// One submitted request with its buffers. The engine calls allocate and done on its own thread.
struct Entry {
  Request request;
  // One per tensor, valid until done is called: host memory, or device memory of
  // request.device (then allocate returns device memory too).
  std::vector<const void*> inputs;
  // request.device's: the framework's cudaStream_t. The collective is enqueued on it (after the
  // work already there, before done is called), so the framework's later work on the stream
  // sees the result; done means enqueued, not finished. nullptr for host memory.
  void* stream = nullptr;
  // Returns the output buffer of tensor i with the given shape, or nullptr with *error set.
  std::function<void*(size_t i, const std::vector<int64_t>& shape, std::string* error)> allocate;
  std::function<void(const Status&)> done;
  // Set by enqueue: when it was submitted (the timeline's NEGOTIATE starts here).
  std::chrono::steady_clock::time_point submitted;
  // The submitting thread may run the cycle itself when the engine's thread is not running one,
  // the requests waiting carry at most 128 KiB, and no peer would keep it waiting: the world
  // has one rank, or this rank has nothing else waiting for peers and every peer has entered
  // the next cycle, already or within the collectives' spin (about 22 us) after this thread
  // asked them to. allocate and done then run inside enqueue. Past the spin the engine's thread
  // waits instead. For callers that wait for the result anyway or whose framework lets a kernel
  // complete inside its call (TensorFlow's asynchronous kernels, the array API); not for callers
  // that overlap the collective with their own work (the torch backend, a training step's
  // gradients: TensorFlow's attr overlap), whose requests fuse on the engine's thread while
  // they compute on (bench/RESULTS.md: inline gradients slowed a training step by 4%).
  bool mayRunInline = false;
};
// A join (Kind::kJoin, no input tensors) gets one int32 scalar output through allocate(0, {}):
// the last rank to join. An alltoall gets two outputs: allocate(0, shape) the received rows
// in rank order, allocate(1, {size}) an int32 vector of the rows received from each rank.

}  // namespace mtxcomm::binding

#endif  // MTXCOMM_BINDINGS_COMMON_ENTRY_H_
