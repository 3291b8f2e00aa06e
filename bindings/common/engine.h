// The binding's engine: one background thread per process that owns the world communicator and
// runs every collective a framework submits, in the same order on every rank.
//
// Frameworks issue collectives from many threads in an order that differs between ranks
// (TensorFlow runs independent ops in any order). The engine makes the order agree, as Horovod's
// controller does (Sergeev & Del Balso, "Horovod: fast and easy distributed deep learning in
// TensorFlow", 2018), but without a coordinator rank:
//   1. each cycle every rank allgathers the requests submitted since the last cycle (name, kind,
//      op, root, dtypes and shapes);
//   2. every rank keeps the same table, name -> per-rank FIFO of requests; the k-th request of a
//      name on one rank pairs with the k-th of the same name on every other rank;
//   3. a name whose FIFO head is present on every rank is ready; ready requests run in the order
//      their last rank submitted them (a global sequence all ranks agree on), after a check
//      that the ranks agree on kind, op, root, dtypes and shapes (else every rank gets the same
//      error naming the tensor and the ranks);
//   4. consecutive ready allreduces with the same dtype and op are packed into one buffer of up
//      to MTXCOMM_FUSION_BYTES (tensor fusion) and reduced by one collective.
// A rank that calls shutdown (or exits through it) ends the engine on every rank in the same
// cycle: requests still waiting fail with an error naming that rank. A communication failure
// fails every waiting and later request with the library's message.
//
// The engine's parts: request.h (what is submitted, its wire format), negotiation.h (the
// table every rank keeps), executor.h (fusion and the collectives), engine.cc (the thread and
// its cycle). None includes framework headers: the framework side (bindings/tensorflow/, a
// future bindings/torch/) provides buffers and callbacks through Entry.
#ifndef MTXCOMM_BINDINGS_COMMON_ENGINE_H_
#define MTXCOMM_BINDINGS_COMMON_ENGINE_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "bindings/common/request.h"
#include "mtxcomm/mtxcomm.h"

namespace mtxcomm::binding {

// One submitted request with its buffers. The engine calls allocate and done on its own thread.
struct Entry {
  Request request;
  std::vector<const void*> inputs;  // host memory, one per tensor, valid until done is called
  // Returns the output buffer of tensor i with the given shape, or nullptr with *error set.
  std::function<void*(size_t i, const std::vector<int64_t>& shape, std::string* error)> allocate;
  std::function<void(const Status&)> done;
};

// The process-wide engine. All functions are thread-safe.
// Creates the world communicator (mtxcomm_comm_init_from_env) and starts the thread; collective
// across ranks. A second call while running is a no-op.
Status init();
// Ends the engine on every rank (see above) and destroys the communicator. Idempotent.
void shutdown();
bool isInitialized();
// Rank facts of the world communicator; -1 when not initialised.
int rank();
int size();
int localRank();
int localSize();
// Queues an entry. When the engine is not running or has failed, done is called at once with the
// error.
void enqueue(Entry entry);
// Library collectives the engine has executed for submitted requests (not counting its own
// negotiation), for tests and profiling.
uint64_t collectiveCount();

}  // namespace mtxcomm::binding

#endif  // MTXCOMM_BINDINGS_COMMON_ENGINE_H_
