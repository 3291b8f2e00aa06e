// The "mtxcomm" backend of torch.distributed in C++, its machinery (c10d_backend.h declares it):
// the C API helpers (dtypes, ops, errors, staging), the Work classes (MtxWork, P2PWork and the
// keeper of the requests still in flight), and the backend's life (construction, close,
// shutdown, abort) and its worker thread with its FIFO queue (run inline or queued, drain,
// the calls delegated to the Python fallback).

#include "c10d_backend.h"

namespace mtxcomm_torch {

// The C API's datatype of a torch dtype, or nothing (the fallback takes it).
std::optional<mtxcomm_datatype_t> dtypeOf(at::ScalarType t) {
  switch (t) {
    case at::kChar:
      return MTXCOMM_INT8;
    case at::kByte:
      return MTXCOMM_UINT8;
    case at::kShort:
      return MTXCOMM_INT16;
    case at::kUInt16:
      return MTXCOMM_UINT16;
    case at::kInt:
      return MTXCOMM_INT32;
    case at::kUInt32:
      return MTXCOMM_UINT32;
    case at::kLong:
      return MTXCOMM_INT64;
    case at::kUInt64:
      return MTXCOMM_UINT64;
    case at::kHalf:
      return MTXCOMM_FLOAT16;
    case at::kBFloat16:
      return MTXCOMM_BFLOAT16;
    case at::kFloat:
      return MTXCOMM_FLOAT32;
    case at::kDouble:
      return MTXCOMM_FLOAT64;
    case at::kBool:
      return MTXCOMM_BOOL;
    default:
      return std::nullopt;
  }
}

std::optional<mtxcomm_op_t> opOf(const c10d::ReduceOp& op) {
  switch (op.op_) {
    case c10d::ReduceOp::SUM:
      return MTXCOMM_SUM;
    case c10d::ReduceOp::AVG:
      return MTXCOMM_AVG;
    case c10d::ReduceOp::PRODUCT:
      return MTXCOMM_PROD;
    case c10d::ReduceOp::MIN:
      return MTXCOMM_MIN;
    case c10d::ReduceOp::MAX:
      return MTXCOMM_MAX;
    default:
      return std::nullopt;
  }
}

bool cudaBuilt() {
  static const bool built = [] {
    int b = 0;
    return mtxcomm_get_build_feature("cuda", &b) == MTXCOMM_SUCCESS && b == 1;
  }();
  return built;
}

bool nativeHost(const at::Tensor& t) {
  return t.defined() && t.device().is_cpu() && t.layout() == at::kStrided &&
         dtypeOf(t.scalar_type()).has_value();
}

bool native(const at::Tensor& t) {
  return t.defined() && (t.device().is_cpu() || (t.device().is_cuda() && cudaBuilt())) &&
         t.layout() == at::kStrided && dtypeOf(t.scalar_type()).has_value();
}

bool native(const std::vector<at::Tensor>& ts) {
  for (const auto& t : ts) {
    if (!native(t) || t.device() != ts[0].device()) return false;
  }
  return !ts.empty();
}

std::optional<c10::Device> cudaDeviceOf(const std::vector<at::Tensor>& ts, const char* what) {
  std::optional<c10::Device> dev;
  for (const auto& t : ts) {
    if (!t.defined()) continue;
    if (!dev) dev = t.device();
    TORCH_CHECK_VALUE(t.device() == *dev, "mtxcomm backend: ", what, ": the tensors are on ",
                      dev->str(), " and ", t.device().str(), " (one call takes one device)");
  }
  if (dev && dev->is_cuda()) return dev;
  return std::nullopt;
}

mtxcomm_datatype_t dt(const at::Tensor& t) { return *dtypeOf(t.scalar_type()); }

size_t bytesOf(const std::vector<at::Tensor>& ts) {
  size_t n = 0;
  for (const auto& t : ts) n += t.nbytes();
  return n;
}

// Throws the C API's error code as a c10 error carrying the library's message.
[[noreturn]] void raise(int code, mtxcomm_comm_t comm, const char* what) {
  const char* last = mtxcomm_get_last_error(comm);
  std::string msg = std::string("mtxcomm backend: ") + what + ": " +
                    (last && *last ? last : mtxcomm_get_error_string(mtxcomm_result_t(code)));
  // In Python: a failed exchange (a peer gone, aborted or silent past the timeout, the
  // transport failing) is torch.distributed.DistBackendError, as PyTorch's own backends raise
  // it; anything else a RuntimeError (also a bad argument, as the Python backend's
  // mtxcomm.InvalidArgumentError is one). DistBackendError is a RuntimeError too.
  switch (code) {
    case MTXCOMM_REMOTE_ERROR:
    case MTXCOMM_TIMEOUT:
    case MTXCOMM_SYSTEM_ERROR:
      C10_THROW_ERROR(DistBackendError, msg);
    default:
      TORCH_CHECK(false, msg);
  }
}

void check(int code, mtxcomm_comm_t comm, const char* what) {
  if (code != MTXCOMM_SUCCESS) raise(code, comm, what);
}

// ---- Work -----------------------------------------------------------------------------------

CudaWork::CudaWork(int rank, c10d::OpType op, std::vector<at::Tensor> outputs, c10::Stream stream)
    : MtxWork(rank, op, std::move(outputs)), stream_(stream), end_(c10::DeviceType::CUDA) {
  end_.record(stream_);
  complete(nullptr);  // enqueued: the host's part is done; the stream's part is end_
}

bool CudaWork::isCompleted() { return end_.query(); }

bool CudaWork::wait(std::chrono::milliseconds /*timeout*/) {
  c10::impl::VirtualGuardImpl impl(c10::DeviceType::CUDA);
  end_.block(impl.getStream(stream_.device()));
  return true;
}

c10::intrusive_ptr<c10::ivalue::Future> CudaWork::getFuture() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!future_) {
    future_ = c10::make_intrusive<c10::ivalue::Future>(
        c10::ListType::create(c10::TensorType::get()), std::vector<c10::Device>{stream_.device()});
    // Completed on the call's stream: the future's own events follow the collective there.
    c10::impl::VirtualGuardImpl impl(c10::DeviceType::CUDA);
    const c10::Stream previous = impl.exchangeStream(stream_);
    try {
      future_->markCompleted(c10::IValue(outputs_));
    } catch (...) {
      impl.exchangeStream(previous);
      throw;
    }
    impl.exchangeStream(previous);
  }
  return future_;
}

P2PWork::~P2PWork() {
  // A request still in flight is not freed (there is no cancel) and its buffer must outlive
  // it: both go to the keeper, which frees them once the request completes.
  if (req_ != nullptr) keep(req_, std::move(staged_));
}

// Frees the kept requests that have completed (at each new post).
void P2PWork::sweep() {
  std::lock_guard<std::mutex> lock(keptMutex());
  auto& kept = keptList();
  for (size_t i = 0; i < kept.size();) {
    int done = 0;
    if (mtxcomm_test(kept[i].first, &done) != MTXCOMM_SUCCESS || done) {
      mtxcomm_request_free(kept[i].first);
      kept[i] = std::move(kept.back());
      kept.pop_back();
    } else {
      ++i;
    }
  }
}

bool P2PWork::isCompleted() {
  std::lock_guard<std::mutex> lock(p2pMutex_);
  if (req_ == nullptr) return true;
  int done = 0;
  int rc = mtxcomm_test(req_, &done);
  if (done || rc != MTXCOMM_SUCCESS) finishLocked(rc);
  return req_ == nullptr;
}

bool P2PWork::wait(std::chrono::milliseconds timeout) {
  {
    std::lock_guard<std::mutex> lock(p2pMutex_);
    if (req_ != nullptr) {
      const auto limit = timeout == kNoTimeout ? groupTimeout_ : timeout;
      double s = std::max(1e-3, limit.count() / 1e3);
      int rc = mtxcomm_wait(req_, s);
      finishLocked(rc);
    }
  }
  return MtxWork::wait(timeout);
}

void P2PWork::finishLocked(int rc) {
  std::exception_ptr error;
  if (rc != MTXCOMM_SUCCESS) {
    try {
      raise(rc, comm_, what_.c_str());
    } catch (...) {
      error = std::current_exception();
    }
  } else {
    try {
      staged_.copyBack();
    } catch (...) {
      error = std::current_exception();
    }
  }
  mtxcomm_request_source(req_, &source_);
  mtxcomm_request_free(req_);
  req_ = nullptr;
  complete(error);
}

int P2PWork::sourceRank() const {
  std::lock_guard<std::mutex> lock(p2pMutex_);
  TORCH_CHECK(req_ == nullptr, "mtxcomm backend: sourceRank() of a ", what_,
              " still in flight: wait for it first");
  return source_;
}

std::mutex& P2PWork::keptMutex() {
  static std::mutex m;
  return m;
}
std::vector<std::pair<mtxcomm_request_t, Staged>>& P2PWork::keptList() {
  static auto* kept = new std::vector<std::pair<mtxcomm_request_t, Staged>>();
  return *kept;
}
void P2PWork::keep(mtxcomm_request_t req, Staged staged) {
  std::lock_guard<std::mutex> lock(keptMutex());
  keptList().emplace_back(req, std::move(staged));
}

// ---- the backend: its life ------------------------------------------------------------------

MtxcommBackend::MtxcommBackend(int rank, int size, uintptr_t comm, py::object fallback,
                               std::chrono::milliseconds timeout, int64_t inlineBytes)
    : c10d::Backend(rank, size),
      comm_(reinterpret_cast<mtxcomm_comm_t>(comm)),
      inlineBytes_(inlineBytes < 0 ? 0 : size_t(inlineBytes)),
      options_(c10::make_intrusive<Options>(kName, timeout)) {
  if (!fallback.is_none()) {
    fallback_ = fallback.cast<c10::intrusive_ptr<c10d::Backend>>();
    fallbackPy_ = std::move(fallback);
  }
}

MtxcommBackend::~MtxcommBackend() {
  close();
  // The Python fallback is released with the GIL, or left to the interpreter at its exit.
  if (fallbackPy_) {
    if (Py_IsInitialized() && !_Py_IsFinalizing()) {
      py::gil_scoped_acquire gil;
      fallbackPy_ = py::object();
    } else {
      fallbackPy_.release();
    }
  }
}

size_t MtxcommBackend::pending() {
  std::lock_guard<std::mutex> lock(qMutex_);
  return pending_;
}

// Runs the calls already made, then frees the communicator (local).
std::string MtxcommBackend::close() {
  std::optional<py::gil_scoped_release> nogil;
  if (Py_IsInitialized() && PyGILState_Check()) nogil.emplace();
  {
    std::unique_lock<std::mutex> lock(qMutex_);
    idle_.wait(lock, [&] { return pending_ == 0; });
    stop_ = true;
  }
  more_.notify_all();
  if (worker_.joinable()) worker_.join();
  std::string found;
  std::lock_guard<std::mutex> lock(commMutex_);
  if (comm_ != nullptr) {
    if (mtxcomm_comm_destroy(comm_) != MTXCOMM_SUCCESS) found = mtxcomm_get_last_error(nullptr);
    comm_ = nullptr;
  }
  freeMonitorRequests();
  return found;
}

void MtxcommBackend::shutdown() {
  const std::string found = close();
  if (fallback_) fallback_->shutdown();
  TORCH_CHECK(found.empty(), "mtxcomm backend: ", found);
}

void MtxcommBackend::abort() {
  mtxcomm_comm_t c = comm_;
  if (c != nullptr) mtxcomm_comm_abort(c);
  comm_ = nullptr;
  if (fallback_) fallback_->abort();
}

// ---- the backend: the worker and its queue --------------------------------------------------

// Runs fn on the communicator: inline when the caller waits for it (opts.asyncOp false), it is
// small and nothing is queued, else on the worker; a call on CUDA tensors on the calling thread,
// enqueued on the device's current stream. A call made with async_op=True never blocks its
// caller: inline it would wait there for its peers, and calls issued on two groups in different
// orders by two ranks (each group in one order, as torch asks) would wait for each other.
c10::intrusive_ptr<c10d::Work> MtxcommBackend::run(c10d::OpType op, std::vector<at::Tensor> outputs,
                                                   size_t bytes, Fn fn,
                                                   std::optional<c10::Device> device, bool waited) {
  TORCH_CHECK(comm_ != nullptr, "mtxcomm backend: the group's communicator was closed");
  if (device) return runOnStream(op, std::move(outputs), *device, fn);
  if (waited && bytes <= inlineBytes_) {
    bool idle;
    {
      std::lock_guard<std::mutex> lock(qMutex_);
      idle = pending_ == 0;
    }
    if (idle) {
      auto error = execute(fn);
      if (!error) return {};
      auto work = c10::make_intrusive<MtxWork>(getRank(), op, std::move(outputs));
      work->complete(error);
      return work;
    }
  }
  auto work = c10::make_intrusive<MtxWork>(getRank(), op, std::move(outputs));
  enqueue(Item{work, std::move(fn)});
  return work;
}

c10::intrusive_ptr<c10d::Work> MtxcommBackend::runOnStream(c10d::OpType op,
                                                           std::vector<at::Tensor> outputs,
                                                           c10::Device device, const Fn& fn) {
  if (pending() != 0) drain();  // calls reach the communicator in the order they are made
  c10::impl::VirtualGuardImpl impl(c10::DeviceType::CUDA);
  const c10::Device previous = impl.exchangeDevice(device);
  try {
    const c10::Stream stream = impl.getStream(device);
    {
      std::lock_guard<std::mutex> lock(commMutex_);
      fn(stream.native_handle());
    }
    auto work = c10::make_intrusive<CudaWork>(getRank(), op, std::move(outputs), stream);
    impl.exchangeDevice(previous);
    return work;
  } catch (...) {
    impl.exchangeDevice(previous);
    throw;
  }
}

std::exception_ptr MtxcommBackend::execute(const Fn& fn) {
  std::lock_guard<std::mutex> lock(commMutex_);
  try {
    fn(nullptr);
  } catch (...) {
    return std::current_exception();
  }
  return nullptr;
}

void MtxcommBackend::loop() {
  for (;;) {
    Item item;
    {
      std::unique_lock<std::mutex> lock(qMutex_);
      more_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;
      item = std::move(queue_.front());
      queue_.pop_front();
    }
    auto error = execute(item.fn);
    auto work = std::move(item.work);
    item = Item{};  // the call's tensors are released before its Work completes
    {
      std::lock_guard<std::mutex> lock(qMutex_);
      --pending_;
    }
    idle_.notify_all();
    if (work) work->complete(error);
  }
}

// Waits until the worker has run every queued call (without the GIL: the worker may need it).
void MtxcommBackend::drain() {
  std::optional<py::gil_scoped_release> nogil;
  if (Py_IsInitialized() && PyGILState_Check()) nogil.emplace();
  std::unique_lock<std::mutex> lock(qMutex_);
  idle_.wait(lock, [&] { return pending_ == 0; });
}

// A call delegated to the Python backend runs on the engine (or the group's communicator),
// and its Work's copies into the caller's outputs are made when someone waits or at the
// Python backend's next call. The worker waits for it (the Python keeper's settle): a
// dropped Work still fills its outputs, and the calls made after it queue behind it.
c10::intrusive_ptr<c10d::Work> MtxcommBackend::delegated(c10::intrusive_ptr<c10d::Work> work) {
  enqueue(Item{nullptr, [](void*) {
                 py::gil_scoped_acquire gil;
                 try {
                   py::module_::import("mtxcomm.torch._work").attr("keeper").attr("settle")();
                 } catch (py::error_already_set& e) {
                   e.discard_as_unraisable("mtxcomm backend: settling a delegated call");
                 }
               }});
  return work;
}

void MtxcommBackend::enqueue(Item item) {
  {
    std::lock_guard<std::mutex> lock(qMutex_);
    if (!worker_.joinable()) worker_ = std::thread([this] { loop(); });
    queue_.push_back(std::move(item));
    ++pending_;
  }
  more_.notify_one();
}

}  // namespace mtxcomm_torch
