// MTXCOMM_STORE: which store a spec names (lib/comm/stores.h).
#include <unistd.h>

#include <cstdio>
#include <random>

#include "lib/base/error.h"
#include "lib/comm/stores.h"

namespace mtxcomm {
namespace {

using Ms = std::chrono::milliseconds;

[[noreturn]] void badSpec(const std::string& spec, const std::string& what) {
  fail(MTXCOMM_INVALID_USAGE, "MTXCOMM_STORE=", spec, ": ", what);
}

}  // namespace

std::string randomHex() {
  static thread_local std::mt19937_64 gen(std::random_device{}() ^
                                          (static_cast<uint64_t>(::getpid()) << 32));
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(gen()));
  return buf;
}

std::unique_ptr<Store> makeStore(const std::string& spec, int rank, int size, Ms timeout,
                                 const JobSecret& secret) {
  if (size < 1 || rank < 0 || rank >= size) {
    fail(MTXCOMM_INVALID_USAGE, "MTXCOMM_STORE=", spec, ": rank ", rank,
         " is not in [0, size) for size ", size);
  }
  if (spec.rfind("file:", 0) == 0) {
    std::string path = spec.substr(5);
    if (path.empty()) badSpec(spec, "empty path (expected file:PATH)");
    while (path.size() > 1 && path.back() == '/') path.pop_back();
    return makeFileStore(spec, path, rank, size, timeout, secret);
  }
  if (spec.rfind("tcp:", 0) == 0) {
    std::string rest = spec.substr(4);
    size_t colon = rest.rfind(':');
    if (colon == std::string::npos) badSpec(spec, "missing port (expected tcp:HOST:PORT)");
    const std::string host = rest.substr(0, colon);
    std::string port = rest.substr(colon + 1);
    if (host.empty()) badSpec(spec, "missing host (expected tcp:HOST:PORT)");
    if (port.empty()) badSpec(spec, "missing port (expected tcp:HOST:PORT)");
    if (port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos) {
      badSpec(spec, "port '" + port + "' is not a number");
    }
    const int portNumber = std::stoi(port);
    if (portNumber < 1 || portNumber > 65535)
      badSpec(spec, "port " + port + " is not in [1, 65535]");
    if (secret.empty()) {
      fail(MTXCOMM_INVALID_USAGE, "MTXCOMM_STORE=", spec,
           ": a tcp: store needs the job's secret, the same on every rank: set "
           "MTXCOMM_JOB_SECRET (e.g. `export MTXCOMM_JOB_SECRET=$(openssl rand -hex 32)`) or "
           "MTXCOMM_JOB_SECRET_FILE (mtxrun sets one for its ranks)");
    }
    return makeTcpStore(spec, host, portNumber, rank, size, timeout, secret);
  }
  badSpec(spec, "expected file:PATH or tcp:HOST:PORT");
}

}  // namespace mtxcomm
