// The "mtxcomm" backend's operations on the group as a whole (c10d_backend.h declares them):
// the monitored barrier (Gloo's contract: dist.monitored_barrier names the ranks that did not
// arrive) and split (dist.split_group: a backend of some of the group's ranks).

#include <algorithm>
#include <sstream>
#include <thread>

#include "c10d_backend.h"

namespace mtxcomm_torch {

namespace {

using Clock = std::chrono::steady_clock;

int64_t millisSince(Clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
}

}  // namespace

std::optional<int> MtxcommBackend::waitUntil(mtxcomm_request_t req, Clock::time_point deadline) {
  // mtxcomm_wait would fail the communicator's point-to-point channel at its timeout; here a
  // late rank is expected and the channel must stay usable, so the request is polled.
  for (int round = 0;; ++round) {
    int done = 0;
    const int rc = mtxcomm_test(req, &done);
    if (done) return rc;
    if (Clock::now() >= deadline) return std::nullopt;
    if (round < 64) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(round < 256 ? 50 : 500));
    }
  }
}

void MtxcommBackend::freeMonitorRequests() {
  std::lock_guard<std::mutex> lock(monitorMutex_);
  for (auto& req : monitorRecv_) {
    int done = 0;
    if (req != nullptr && (mtxcomm_test(req, &done) != MTXCOMM_SUCCESS || done)) {
      mtxcomm_request_free(req);
      req = nullptr;
    }
  }
}

void MtxcommBackend::monitoredBarrier(const c10d::BarrierOptions& opts, bool waitAllRanks) {
  drain();  // after the calls made before it
  std::optional<py::gil_scoped_release> nogil;
  if (Py_IsInitialized() && PyGILState_Check()) nogil.emplace();
  std::lock_guard<std::mutex> lock(monitorMutex_);
  TORCH_CHECK(comm_ != nullptr, "mtxcomm backend: the group's communicator was closed");
  const int me = getRank(), n = getSize();
  const auto timeout = opts.timeout == c10d::kUnsetTimeout ? options_->timeout : opts.timeout;
  const auto start = Clock::now();
  const int64_t seq = ++monitorSeq_;
  if (monitorRecv_.empty()) {
    monitorRecv_.assign(size_t(n), nullptr);
    monitorIn_.assign(size_t(n), 0);
  }
  // Waits for the message of this barrier (or a later one) from peer; an earlier barrier's
  // (a rank that came late to it) is skipped. The reason it did not arrive, or "".
  auto arrival = [&](int peer, Clock::time_point deadline) -> std::string {
    for (;;) {
      mtxcomm_request_t& req = monitorRecv_[size_t(peer)];
      if (req == nullptr) {
        int rc = mtxcomm_irecv(&monitorIn_[size_t(peer)], 1, MTXCOMM_INT64, peer, kMonitorTag,
                               comm_, &req);
        if (rc != MTXCOMM_SUCCESS) return mtxcomm_get_last_error(comm_);
      }
      auto rc = waitUntil(req, deadline);
      if (!rc) return "no message within the timeout";
      mtxcomm_request_free(req);
      req = nullptr;
      if (*rc != MTXCOMM_SUCCESS) return mtxcomm_get_last_error(comm_);
      if (monitorIn_[size_t(peer)] >= seq) return "";
    }
  };
  // Sends this barrier's number to peer; a send that does not complete in time is kept (its
  // buffer with it) until it does.
  auto post = [&](int peer) -> std::string {
    at::Tensor value = at::full({1}, seq, at::kLong);
    mtxcomm_request_t req = nullptr;
    int rc = mtxcomm_isend(value.data_ptr(), 1, MTXCOMM_INT64, peer, kMonitorTag, comm_, &req);
    if (rc != MTXCOMM_SUCCESS) return mtxcomm_get_last_error(comm_);
    auto done = waitUntil(req, start + timeout);
    if (!done) {
      P2PWork::keep(req, Staged(value));
      return "the send did not complete within the timeout";
    }
    mtxcomm_request_free(req);
    return *done == MTXCOMM_SUCCESS ? "" : mtxcomm_get_last_error(comm_);
  };

  if (me != 0) {
    std::string why = post(0);
    if (why.empty()) why = arrival(0, start + timeout);
    TORCH_CHECK(why.empty(), "[Rank ", me, "]: Rank ", me,
                " successfully reached monitoredBarrier, but received errors while waiting for "
                "send/recv from rank 0. Please check rank 0 logs for faulty rank. (",
                why, ")");
    return;
  }
  std::vector<int> failed;
  std::ostringstream causes;
  for (int r = 1; r < n; ++r) {
    // Without waitAllRanks the timeout is the barrier's as a whole; with it, each rank's.
    auto deadline = waitAllRanks ? Clock::now() + timeout : start + timeout;
    TORCH_CHECK(waitAllRanks || Clock::now() < deadline, "[Rank 0]: Rank 0 timed out in ",
                "monitoredBarrier after ", millisSince(start), " ms (timeout ", timeout.count(),
                " ms)");
    std::string why = arrival(r, deadline);
    if (why.empty()) continue;
    TORCH_CHECK(waitAllRanks, "[Rank 0]: Rank ", r, " failed to pass monitoredBarrier in ",
                timeout.count(), " ms (", why, ")");
    failed.push_back(r);
    causes << (causes.tellp() > 0 ? "; " : "") << "rank " << r << ": " << why;
  }
  if (!failed.empty()) {
    std::ostringstream ranks;
    for (size_t i = 0; i < failed.size(); ++i) ranks << (i ? ", " : "") << failed[i];
    TORCH_CHECK(false, "[Rank 0]: Ranks ", ranks.str(), " failed to pass monitoredBarrier in ",
                timeout.count(), " ms (", causes.str(), ")");
  }
  for (int r = 1; r < n; ++r) {
    std::string why = post(r);
    TORCH_CHECK(why.empty(), "[Rank 0]: monitoredBarrier: releasing rank ", r, " failed: ", why);
  }
}

c10::intrusive_ptr<c10d::Backend> MtxcommBackend::split(
    const c10::intrusive_ptr<c10d::Store>& store, const std::vector<int>& ranks,
    const c10::intrusive_ptr<Options>& opts) {
  if (std::find(ranks.begin(), ranks.end(), getRank()) == ranks.end()) return nullptr;
  TORCH_CHECK(fallbackPy_, "mtxcomm backend: split_group needs the group's Python backend");
  drain();  // the new group's bootstrap follows this group's calls made before it
  py::gil_scoped_acquire gil;
  const auto timeout = opts ? opts->timeout : options_->timeout;
  const std::string name = opts ? opts->group_name : std::string();
  py::object made =
      py::module_::import("mtxcomm.torch.backend")
          .attr("split_backend")(fallbackPy_, store, ranks, double(timeout.count()) / 1e3, name);
  return made.cast<c10::intrusive_ptr<c10d::Backend>>();
}

}  // namespace mtxcomm_torch
