// mtxcomm._core: the framework-neutral array API's way into the binding engine
// (bindings/common/engine.h). python/mtxcomm/_arrays.py turns NumPy, DLPack (PyTorch, JAX) and
// buffer-protocol arrays into C-contiguous host buffers, viewed as bytes, and calls run(); this
// module builds one engine Entry over those buffers, submits it and waits for it.
//
// One engine per process: this module and the TensorFlow binding (mtxcomm.tensorflow._mtxcomm_tf)
// both link the shared library libmtxcomm_engine (installed in mtxcomm/lib, found through each
// module's RPATH), so a process that uses both has one engine thread and one world communicator:
// mtxcomm.init() and mtxcomm.tensorflow.init() start the same engine, and the TensorFlow ops and
// the array calls are negotiated in the same cycles.
//
// The name. A call is blocking and calls are made in program order, so every array call is
// submitted under the one name "mtxcomm.array": the engine pairs the k-th request of a name on
// one rank with the k-th on every other rank, which is the k-th array call of each process.
// Ranks whose k-th calls differ (an allreduce here, a broadcast there, other shapes) get the
// engine's mismatch error at once, naming both calls. A name per call ("mtxcomm.array.<k>")
// would pair the same way but defeat the response cache: the cache keeps agreed requests by
// name and never evicts (MTXCOMM_CACHE_CAPACITY), so unique names would fill it with entries
// that never hit again, and a TensorFlow job's per-step tensors could no longer be cached; with
// one name, a repeated call (same kind, op, dtype, shape) is one bit of the next cycle. Errors
// carry k instead ("array call #k of this process", counted from the array API's init() that
// started the engine). Calls from several threads are serialised here (one at a time per
// process); their order must still be the same on every rank.
//
// run() releases the GIL while it waits and returns the engine's Status as (code, message);
// _arrays.py raises the Python exception that the code maps to. A result with no caller-given
// output lives in a 64-byte aligned buffer that the returned NumPy array owns (no copy).
//
// Why pybind11 and not nanobind: pybind11 is already a build requirement (pyproject.toml) and
// the TensorFlow module is written with it; this module is a dozen functions over raw buffers,
// where a binding library's per-call cost (about a microsecond) is small next to the engine's
// own (21 us per call at np=2, bench/RESULTS.md); nanobind would add a second binding library to
// the build for no gain that could be measured here.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "bindings/common/engine.h"

namespace py = pybind11;
namespace eng = mtxcomm::binding;

namespace {

constexpr size_t kAlignment = 64;

std::string shapeString(const std::vector<int64_t>& shape) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) {
    s += (i ? ", " : "") + std::to_string(shape[i]);
  }
  return s + (shape.size() == 1 ? ",)" : ")");
}

size_t elementsOf(const std::vector<int64_t>& shape) {
  size_t n = 1;
  for (int64_t d : shape) n *= static_cast<size_t>(d);
  return n;
}

// A result buffer the engine writes and the returned NumPy array then owns.
struct Owned {
  void* data = nullptr;
  size_t bytes = 0;
  ~Owned() { std::free(data); }
};

// One call's state, shared by the caller (waiting) and the engine thread (allocate, done).
struct Call {
  std::mutex mu;
  std::condition_variable cv;
  bool finished = false;
  eng::Status status;
  size_t elementSize = 1;
  void* out = nullptr;  // the caller's output buffer, or nullptr: allocate one
  std::vector<int64_t> outShape;
  std::vector<int64_t> resultShape;
  std::unique_ptr<Owned> owned;
  std::vector<int32_t> received;  // alltoall: rows received from each rank
  std::string outError;           // out= does not fit the result (allgather)
};

std::mutex& callMutex() {  // one array call at a time per process (see the header)
  static std::mutex* m = new std::mutex();
  return *m;
}
uint64_t nextSequence = 0;  // guarded by callMutex(): this process's array calls since init
// The buffers handed to the engine by the last call, for the tests.
std::atomic<uintptr_t> lastInput{0}, lastOutput{0};

void* allocateResult(Call& c, size_t i, const std::vector<int64_t>& shape, std::string* err) {
  if (i == 1) {  // alltoall's received splits
    c.received.assign(elementsOf(shape), 0);
    return c.received.data();
  }
  c.resultShape = shape;
  const size_t bytes = elementsOf(shape) * c.elementSize;
  if (c.out) {
    if (shape != c.outShape) {
      c.outError = "out has shape " + shapeString(c.outShape) + " but the result has shape " +
                   shapeString(shape);
      *err = c.outError;
      return nullptr;
    }
    return c.out;
  }
  auto owned = std::make_unique<Owned>();
  owned->bytes = bytes;
  const size_t rounded = (bytes + kAlignment - 1) / kAlignment * kAlignment;
  owned->data = std::aligned_alloc(kAlignment, rounded == 0 ? kAlignment : rounded);
  if (!owned->data) {
    *err = "cannot allocate " + std::to_string(bytes) + " bytes for the result";
    return nullptr;
  }
  c.owned = std::move(owned);
  return c.owned->data;
}

// run(kind, x, dtype, shape, op, root, splits, out, out_shape) -> (code, message, result,
// result_shape, received_splits). x: a C-contiguous buffer of the input's bytes; out: None or a
// writable C-contiguous buffer for the result (the same buffer as x for in place), whose shape
// is out_shape. result: a NumPy uint8 array owning the result's bytes when out is None.
py::tuple run(int kind, const py::buffer& x, int dtype, const std::vector<int64_t>& shape, int op,
              int root, const std::optional<std::vector<int64_t>>& splits, const py::object& out,
              const std::vector<int64_t>& outShape) {
  if (kind < 0 || kind >= eng::kNumKinds || kind == static_cast<int>(eng::Kind::kJoin)) {
    throw py::value_error("mtxcomm._core.run: bad kind " + std::to_string(kind));
  }
  if (dtype < 0 || dtype >= MTXCOMM_NUM_DATATYPES) {
    throw py::value_error("mtxcomm._core.run: bad dtype " + std::to_string(dtype));
  }
  if (op < 0 || op >= MTXCOMM_NUM_OPS) {
    throw py::value_error("mtxcomm._core.run: bad op " + std::to_string(op));
  }
  const auto dt = static_cast<mtxcomm_datatype_t>(dtype);
  py::buffer_info in = x.request();
  const size_t esize = mtxcomm_datatype_size(dt);
  if (static_cast<size_t>(in.size * in.itemsize) != elementsOf(shape) * esize) {
    throw py::value_error("mtxcomm._core.run: the input has " +
                          std::to_string(in.size * in.itemsize) + " bytes, not those of shape " +
                          shapeString(shape));
  }
  std::optional<py::buffer_info> outInfo;
  auto call = std::make_shared<Call>();
  call->elementSize = esize;
  if (!out.is_none()) {
    outInfo = out.cast<py::buffer>().request(/*writable=*/true);
    call->out = outInfo->ptr;
    call->outShape = outShape;
  }

  const auto k = static_cast<eng::Kind>(kind);
  eng::Entry e;
  e.request.kind = k;
  e.request.name = "mtxcomm.array";
  e.request.op = static_cast<mtxcomm_op_t>(op);
  e.request.root = root;
  e.request.tensors.push_back({dt, shape});
  if (splits) e.request.splits = *splits;
  e.inputs.push_back(in.ptr);
  e.allocate = [call](size_t i, const std::vector<int64_t>& s, std::string* err) -> void* {
    return allocateResult(*call, i, s, err);
  };
  e.done = [call](const eng::Status& st) {
    std::lock_guard<std::mutex> lk(call->mu);
    call->status = st;
    call->finished = true;
    call->cv.notify_all();
  };
  e.mayRunInline = true;  // the caller waits for the result below
  uint64_t sequence = 0;
  {
    py::gil_scoped_release release;
    std::lock_guard<std::mutex> serial(callMutex());
    sequence = nextSequence++;
    lastInput = reinterpret_cast<uintptr_t>(in.ptr);
    lastOutput = reinterpret_cast<uintptr_t>(call->out);
    eng::enqueue(std::move(e));
    std::unique_lock<std::mutex> lk(call->mu);
    call->cv.wait(lk, [&] { return call->finished; });
    if (!call->out && call->owned) lastOutput = reinterpret_cast<uintptr_t>(call->owned->data);
  }

  eng::Status st = call->status;
  if (!call->outError.empty()) {
    // The collective ran (the ranks stay in step); only this rank's out= was wrong.
    st = {MTXCOMM_INVALID_ARGUMENT, "mtxcomm " + std::string(eng::kindName(k)) + " on rank " +
                                        std::to_string(eng::rank()) + ": " + call->outError};
  }
  if (!st.ok()) st.message += " (array call #" + std::to_string(sequence) + " of this process)";
  py::object result = py::none(), received = py::none();
  if (st.ok() && call->owned) {
    Owned* o = call->owned.release();
    py::capsule owner(o, [](void* p) { delete static_cast<Owned*>(p); });
    result =
        py::array_t<uint8_t>({static_cast<py::ssize_t>(o->bytes)}, {static_cast<py::ssize_t>(1)},
                             static_cast<uint8_t*>(o->data), owner);
  }
  if (st.ok() && k == eng::Kind::kAlltoall) received = py::cast(call->received);
  return py::make_tuple(static_cast<int>(st.code), st.message, result, call->resultShape, received);
}

// ---- asynchronous calls over raw addresses (the torch.distributed backend) -------------------
//
// submit() queues one request whose input and output buffers are given as addresses (a
// tensor's data_ptr()) and returns at once with a Pending; the caller keeps the buffers alive
// and untouched until the Pending is done (mtxcomm/torch keeps the tensors in its Work). Unlike
// run(), several submits may be in flight, each under the name the caller gives (distinct
// among those in flight on this rank: the engine refuses a second one), so the engine may fuse
// them. Outputs are the caller's: allocate() checks the shape the engine agreed on against the
// caller's and fails the request (on this rank) with a message naming both when they differ.
struct Pending {
  std::mutex mu;
  std::condition_variable cv;
  bool finished = false;
  eng::Status status;
  std::string kind;
  std::vector<uintptr_t> outputs;
  std::vector<std::vector<int64_t>> outShapes;
  std::vector<int32_t> received;  // alltoall: rows received from each rank
  std::string outError;

  // Waits up to timeoutSeconds (< 0: forever) with the GIL released; true when done.
  bool wait(double timeoutSeconds) {
    py::gil_scoped_release release;
    std::unique_lock<std::mutex> lk(mu);
    if (timeoutSeconds < 0) {
      cv.wait(lk, [&] { return finished; });
      return true;
    }
    return cv.wait_for(lk, std::chrono::duration<double>(timeoutSeconds), [&] { return finished; });
  }
  bool done() {
    std::lock_guard<std::mutex> lk(mu);
    return finished;
  }
};

// Queues e (GIL released) with p as what its done() completes.
void enqueueFor(eng::Entry e, const std::shared_ptr<Pending>& p) {
  e.done = [p](const eng::Status& st) {
    std::lock_guard<std::mutex> lk(p->mu);
    p->status = st;
    p->finished = true;
    p->cv.notify_all();
  };
  py::gil_scoped_release release;
  eng::enqueue(std::move(e));
}

std::shared_ptr<Pending> submit(int kind, const std::string& name,
                                const std::vector<uintptr_t>& inputs, int dtype,
                                const std::vector<std::vector<int64_t>>& shapes, int op, int root,
                                const std::optional<std::vector<int64_t>>& splits,
                                const std::vector<uintptr_t>& outputs,
                                const std::vector<std::vector<int64_t>>& outShapes) {
  if (kind < 0 || kind >= eng::kNumKinds || kind == static_cast<int>(eng::Kind::kJoin)) {
    throw py::value_error("mtxcomm._core.submit: bad kind " + std::to_string(kind));
  }
  if (dtype < 0 || dtype >= MTXCOMM_NUM_DATATYPES) {
    throw py::value_error("mtxcomm._core.submit: bad dtype " + std::to_string(dtype));
  }
  if (op < 0 || op >= MTXCOMM_NUM_OPS) {
    throw py::value_error("mtxcomm._core.submit: bad op " + std::to_string(op));
  }
  if (inputs.size() != shapes.size() || outputs.size() != outShapes.size() ||
      outputs.size() != inputs.size() || inputs.empty()) {
    throw py::value_error(
        "mtxcomm._core.submit: one input address, shape, output address and "
        "output shape per tensor");
  }
  const auto k = static_cast<eng::Kind>(kind);
  auto p = std::make_shared<Pending>();
  p->kind = eng::kindName(k);
  p->outputs = outputs;
  p->outShapes = outShapes;
  eng::Entry e;
  e.request.kind = k;
  e.request.name = name;
  e.request.op = static_cast<mtxcomm_op_t>(op);
  e.request.root = root;
  for (size_t i = 0; i < inputs.size(); ++i) {
    e.request.tensors.push_back({static_cast<mtxcomm_datatype_t>(dtype), shapes[i]});
    e.inputs.push_back(reinterpret_cast<const void*>(inputs[i]));
  }
  if (splits) e.request.splits = *splits;
  e.allocate = [p, k](size_t i, const std::vector<int64_t>& s, std::string* err) -> void* {
    if (k == eng::Kind::kAlltoall && i == 1) {
      p->received.assign(elementsOf(s), 0);
      return p->received.data();
    }
    if (i >= p->outputs.size()) {
      *err = "no output " + std::to_string(i);
      return nullptr;
    }
    if (s != p->outShapes[i]) {
      p->outError = "the output has shape " + shapeString(p->outShapes[i]) +
                    " but the result has shape " + shapeString(s);
      *err = p->outError;
      return nullptr;
    }
    return reinterpret_cast<void*>(p->outputs[i]);
  };
  enqueueFor(std::move(e), p);
  return p;
}

// join(): this rank is out of work (engine.h, Join) until every rank has joined; returns
// (code, message, the last rank to join). Named "mtxcomm.join" as the TensorFlow op is, so a
// process using both joins once.
std::tuple<int, std::string, int> join() {
  auto p = std::make_shared<Pending>();
  p->kind = "join";
  auto last = std::make_shared<int32_t>(-1);
  eng::Entry e;
  e.request.kind = eng::Kind::kJoin;
  e.request.name = "mtxcomm.join";
  e.allocate = [last](size_t, const std::vector<int64_t>&, std::string*) -> void* {
    return last.get();
  };
  enqueueFor(std::move(e), p);
  p->wait(-1.0);
  return std::make_tuple(static_cast<int>(p->status.code), p->status.message,
                         static_cast<int>(*last));
}
}  // namespace

PYBIND11_MODULE(_core, m) {
  m.doc() =
      "mtxcomm's engine for the array API (mtxcomm.allreduce etc.): the process's world "
      "communicator and engine thread, shared with mtxcomm.tensorflow.";
  m.def(
      "init",
      [] {
        eng::Status st;
        {
          py::gil_scoped_release release;
          std::lock_guard<std::mutex> serial(callMutex());
          if (!eng::isInitialized()) {
            st = eng::init();
            if (st.ok()) nextSequence = 0;  // every rank starts its count with this init
          }
        }
        return std::make_tuple(static_cast<int>(st.code), st.message);
      },
      "Creates the world communicator and starts the engine (collective) unless it runs. "
      "Returns (code, message).");
  m.def(
      "shutdown",
      [] {
        eng::Status st;
        {
          py::gil_scoped_release release;
          st = eng::shutdown();
        }
        return std::make_tuple(static_cast<int>(st.code), st.message);
      },
      "Stops the engine on every rank and frees the communicator. Idempotent. Returns (code, "
      "message): the destroy's, which fails where a check an earlier call left pending finds "
      "the ranks disagreeing.");
  m.def(
      "exiting_on_error", [] { mtxcomm_exiting_on_error(); },
      "This process is ending on an error: its exit skips the MPI_Finalize that would wait "
      "for every other rank (mtxcomm_exiting_on_error).");
  m.def("is_initialized", &eng::isInitialized);
  m.def("rank", &eng::rank);
  m.def("size", &eng::size);
  m.def(
      "world_comm", [] { return reinterpret_cast<uintptr_t>(eng::worldComm()); },
      "The engine's world communicator as an address (0 when not running), for the C API's "
      "point-to-point calls through ctypes.");
  m.def("local_rank", &eng::localRank);
  m.def("local_size", &eng::localSize);
  m.def("collective_count", &eng::collectiveCount,
        "Library collectives the engine ran for submitted requests (negotiation not counted).");
  m.def("inline_cycle_count", &eng::inlineCycleCount,
        "Engine cycles a submitting thread ran itself (no hand-over to the engine's thread).");
  m.def("run", &run, py::arg("kind"), py::arg("x"), py::arg("dtype"), py::arg("shape"),
        py::arg("op"), py::arg("root"), py::arg("splits"), py::arg("out"), py::arg("out_shape"),
        "One collective through the engine; see core_module.cc.");
  py::class_<Pending, std::shared_ptr<Pending>>(m, "Pending", "A submitted request (see submit).")
      .def("wait", &Pending::wait, py::arg("timeout") = -1.0,
           "Waits up to timeout seconds (< 0: forever), GIL released; True when done.")
      .def("done", &Pending::done)
      .def(
          "status",
          [](Pending& p) {
            std::lock_guard<std::mutex> lk(p.mu);
            eng::Status st = p.status;
            if (!p.outError.empty()) {
              st = {MTXCOMM_INVALID_ARGUMENT, "mtxcomm " + p.kind + " on rank " +
                                                  std::to_string(eng::rank()) + ": " + p.outError};
            }
            return std::make_tuple(static_cast<int>(st.code), st.message);
          },
          "(code, message) once done.")
      .def("received_splits", [](Pending& p) {
        std::lock_guard<std::mutex> lk(p.mu);
        return p.received;
      });
  m.def(
      "build_feature",
      [](const std::string& feature) {
        int built = 0;
        if (mtxcomm_get_build_feature(feature.c_str(), &built) != MTXCOMM_SUCCESS) {
          throw py::value_error(std::string("mtxcomm._core.build_feature: ") +
                                mtxcomm_get_last_error(nullptr));
        }
        return built != 0;
      },
      "Whether the library was built with feature (\"mpi\", \"ucx\", \"cuda\", \"nccl\", "
      "\"hwloc\"); ValueError naming the known ones for another name.");
  m.def(
      "nccl_version",
      [] {
        int version = 0;
        mtxcomm_get_nccl_version(&version);
        return version;
      },
      "NCCL_VERSION_CODE of the NCCL the nccl device path loads, 0 when none (no nccl path in "
      "this build, or NCCL cannot be loaded: mtxcomm_get_nccl_version).");
  m.def("join", &join, "Joins (engine.h): returns (code, message, last rank to join).");
  m.def("submit", &submit, py::arg("kind"), py::arg("name"), py::arg("inputs"), py::arg("dtype"),
        py::arg("shapes"), py::arg("op"), py::arg("root"), py::arg("splits"), py::arg("outputs"),
        py::arg("out_shapes"),
        "Queues one request over raw addresses and returns a Pending; see core_module.cc.");
  m.def(
      "last_buffers", [] { return std::make_tuple(lastInput.load(), lastOutput.load()); },
      "(input, output) addresses handed to the engine by the last call, for the tests.");
  m.def("error_string", [](int code) {
    return std::string(mtxcomm_get_error_string(static_cast<mtxcomm_result_t>(code)));
  });
  m.attr("KIND_ALLREDUCE") = static_cast<int>(eng::Kind::kAllreduce);
  m.attr("KIND_ALLGATHER") = static_cast<int>(eng::Kind::kAllgather);
  m.attr("KIND_BROADCAST") = static_cast<int>(eng::Kind::kBroadcast);
  m.attr("KIND_REDUCE_SCATTER") = static_cast<int>(eng::Kind::kReduceScatter);
  m.attr("KIND_ALLTOALL") = static_cast<int>(eng::Kind::kAlltoall);
}
