// The bootstrap stores behind MTXCOMM_STORE (the Store interface is lib/base/store.h):
//   file:PATH      FileStore (lib/comm/file_store.cc): a directory on a file system every rank
//                  sees (created if missing); each key is a file, written under a temporary
//                  name and renamed into place (atomic). The directory may be reused by
//                  successive jobs, but not by two jobs at the same time: use one directory per
//                  running job (see "Jobs" below).
//   tcp:HOST:PORT  TcpStore: rank 0 hosts a small server on HOST:PORT (a thread,
//                  lib/comm/tcp_store_server.{h,cc}); every rank, rank 0 included, is a client
//                  (lib/comm/tcp_store_client.cc).
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
// directory at once) are detected and reported as MTXCOMM_INVALID_USAGE; so is a second job
// started while the first runs (rank 0 holds an flock on mtxcomm.lock).
//
// Rank 0's liveness in a file store. A rank 0 that dies during init (killed, crashed) writes no
// fault file; without more, the other ranks would wait for it until their timeout. While its
// store lives (the whole bootstrap; jobs of one rank excepted), rank 0 keeps a heartbeat,
// "mtxcomm.alive": its liveness identity (lib/base/liveness.h: node and pid), the job id and a
// counter it rewrites in place every 0.5 s; it removes the file when its store ends. A rank
// waiting to join or for a key (and the TCP transport's bootstrap, through Store::check) looks
// at it every 100 ms and fails with MTXCOMM_REMOTE_ERROR naming rank 0 once it is gone: on the
// same node, as soon as its process no longer exists; on another node, once the counter has not
// changed for 5 s of the waiting rank's own clock (no clocks are compared across nodes; the file
// system must give close-to-open consistency, as NFS does by default). Which heartbeat is this
// job's: after admission, the one with this job's id; before it, one written since this rank
// first asked to join. A rank 0 that died before any other rank asked to join is
// indistinguishable from an earlier job's and is waited for until the timeout.
//
// Other users. A directory writable by other users is refused unless it is sticky; there the
// store believes only files and folders of this user that nobody else can write (join
// requests, answers, the job folder, keys), and the job folder is 0700 with the job's secret
// in a 0600 file, which the other ranks read after they join.
#ifndef MTXCOMM_LIB_COMM_STORES_H_
#define MTXCOMM_LIB_COMM_STORES_H_

#include <chrono>
#include <memory>
#include <string>

#include "lib/base/store.h"

namespace mtxcomm {

// Parses spec ("file:PATH" or "tcp:HOST:PORT") and connects; rank 0 of a tcp store starts the
// server. For a file store this is collective over the size ranks (see "Jobs in a file store").
// Throws mtxcomm::Error(MTXCOMM_INVALID_USAGE) naming MTXCOMM_STORE for a bad spec.
// secret: the configured job secret (MTXCOMM_JOB_SECRET, MTXCOMM_JOB_SECRET_FILE) or none. A
// tcp: store needs one (every connection to rank 0's server proves it: lib/base/auth.h); a file:
// store takes it, or makes one, and keeps it in the job's private folder.
std::unique_ptr<Store> makeStore(const std::string& spec, int rank, int size,
                                 std::chrono::milliseconds timeout, const JobSecret& secret);

// The two kinds, for makeStore: spec is the whole MTXCOMM_STORE value (for messages).
std::unique_ptr<Store> makeFileStore(const std::string& spec, const std::string& dir, int rank,
                                     int size, std::chrono::milliseconds timeout,
                                     const JobSecret& secret);
std::unique_ptr<Store> makeTcpStore(const std::string& spec, const std::string& host, int port,
                                    int rank, int size, std::chrono::milliseconds timeout,
                                    const JobSecret& secret);

// 16 random hex digits (a job id, a join nonce, a temporary-file tag).
std::string randomHex();

}  // namespace mtxcomm

#endif  // MTXCOMM_LIB_COMM_STORES_H_
