// The Python side of the binding's engine (module mtxcomm.tensorflow._mtxcomm_tf). The same
// shared object holds the TensorFlow ops, so that Python and the ops share one engine:
// tf.load_op_library() and the Python import open the same file.
#include <pybind11/pybind11.h>

#include <stdexcept>
#include <string>

#include "bindings/common/engine.h"

namespace py = pybind11;
namespace eng = mtxcomm::binding;

PYBIND11_MODULE(_mtxcomm_tf, m) {
  m.doc() = "mtxcomm's engine: world communicator, background negotiation thread.";
  m.def(
      "init",
      [] {
        eng::Status st;
        {
          py::gil_scoped_release release;
          st = eng::init();
        }
        if (!st.ok()) throw std::runtime_error(st.message);
      },
      "Creates the world communicator from the environment (mpirun or MTXCOMM_STORE) and "
      "starts the engine. Collective. Raises RuntimeError with the library's message.");
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
  m.def("is_initialized", &eng::isInitialized);
  m.def("rank", &eng::rank);
  m.def("size", &eng::size);
  m.def("local_rank", &eng::localRank);
  m.def("local_size", &eng::localSize);
  m.def("cpu_share", &eng::cpuShare,
        "This rank's share of its node's cores (threads its work should use); -1 before init.");
  m.def("collective_count", &eng::collectiveCount,
        "Library collectives run for submitted tensors (negotiation not counted).");
  m.def("inline_cycle_count", &eng::inlineCycleCount,
        "Engine cycles a submitting thread ran itself (no hand-over to the engine's thread).");
  m.def(
      "build_feature",
      [](const std::string& feature) {
        int built = 0;
        if (mtxcomm_get_build_feature(feature.c_str(), &built) != MTXCOMM_SUCCESS) {
          throw std::invalid_argument(mtxcomm_get_last_error(nullptr));
        }
        return built != 0;
      },
      "Whether the library was built with feature: mpi, ucx, cuda, nccl or hwloc.");
  m.def("version", [] {
    int v = 0;
    mtxcomm_get_version(&v);
    return v;
  });
}
