// Bootstrap key-value store: how ranks meet without MPI (MTXCOMM_STORE), the way NCCL and Gloo
// bootstrap. Keys are short strings; values are byte strings. Writes are set-once per key.
//   file:PATH      a directory on a file system every rank sees (created if missing); each key
//                  is a file, written under a temporary name and renamed into place (atomic).
//                  The directory may be reused by successive jobs, but not by two jobs at the
//                  same time: use one directory per running job (see "Jobs" below).
//   tcp:HOST:PORT  rank 0 hosts a small server on HOST:PORT (a thread); every rank, rank 0
//                  included, is a client.
//
// Jobs in a file store. Keys written by an earlier job in the same directory must never be read
// by a later one (a stale "tcp/addr/1" would send a rank to a dead port). Timestamps cannot tell
// stale from fresh (rank 0 may legitimately have written a key long before rank 1 starts, and
// clocks of the nodes differ), so ranks > 0 learn the job id from the live rank 0 itself:
//   1. Rank 0 removes every "mtxcomm.*" entry of the directory (what earlier jobs left; nothing
//      else is touched), picks a random 64-bit job id J and creates "mtxcomm.job.J/", where all
//      keys of this job live.
//   2. Rank r > 0 creates "mtxcomm.hello.r.N" (N: a random nonce of this process) and waits for
//      "mtxcomm.ack.N". Should rank 0's clean-up of step 1 remove the request (rank r started
//      first), rank r creates it again.
//   3. Rank 0 answers each request by writing J to "mtxcomm.ack.N" (atomically), until every rank
//      has joined; makeStore returns on rank 0 only then (or throws MTXCOMM_TIMEOUT naming the
//      missing ranks).
// Every request rank 0 sees was made after its clean-up began, hence by a process of this job,
// and the nonce routes the answer to that process only: no rank can read another job's keys.
// Assumptions: rename(2) is atomic and the earlier job is over (no process of it still writes
// to the directory). Two processes asking to join as the same rank (two jobs sharing the
// directory at once) are detected and reported as MTXCOMM_INVALID_USAGE.
#ifndef MTXCOMM_LIB_STORE_H_
#define MTXCOMM_LIB_STORE_H_

#include <chrono>
#include <memory>
#include <string>

namespace mtxcomm {

class Store {
 public:
  virtual ~Store() = default;
  virtual void set(const std::string& key, const std::string& value) = 0;
  // Waits until key is set, up to timeout; throws mtxcomm::Error(MTXCOMM_TIMEOUT) naming the key
  // after that, MTXCOMM_SYSTEM_ERROR / MTXCOMM_REMOTE_ERROR if the store fails.
  virtual std::string get(const std::string& key, std::chrono::milliseconds timeout) = 0;
};

// Parses spec ("file:PATH" or "tcp:HOST:PORT") and connects; rank 0 of a tcp store starts the
// server. For a file store this is collective over the size ranks (see "Jobs in a file store").
// Throws mtxcomm::Error(MTXCOMM_INVALID_USAGE) naming MTXCOMM_STORE for a bad spec.
std::unique_ptr<Store> makeStore(const std::string& spec, int rank, int size,
                                 std::chrono::milliseconds timeout);

}  // namespace mtxcomm

#endif  // MTXCOMM_LIB_STORE_H_
