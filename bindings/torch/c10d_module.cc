// The Python module mtxcomm.torch._c10d: the pybind11 registration of the "mtxcomm" backend of
// torch.distributed in C++ (MtxcommBackend, declared in c10d_backend.h), of the ProcessGroup
// that names it (MtxcommProcessGroup) and TORCH_VERSION, the torch it was compiled against.

#include "c10d_backend.h"

#ifndef MTXCOMM_TORCH_VERSION
#define MTXCOMM_TORCH_VERSION "unknown"
#endif

PYBIND11_MODULE(_c10d, m) {
  namespace py = pybind11;
  using mtxcomm_torch::MtxcommBackend;
  m.doc() = "mtxcomm's torch.distributed backend in C++ (bindings/torch/c10d_backend.cc)";
  m.attr("TORCH_VERSION") = MTXCOMM_TORCH_VERSION;
  // The base class must be known to pybind11 first (torch's own module registers it).
  py::module_::import("torch._C._distributed_c10d");
  py::class_<MtxcommBackend, c10d::Backend, c10::intrusive_ptr<MtxcommBackend>>(m, "MtxcommBackend")
      .def(py::init([](int rank, int size, uintptr_t comm, py::object fallback,
                       double timeoutSeconds, int64_t inlineBytes) {
             return c10::make_intrusive<MtxcommBackend>(
                 rank, size, comm, std::move(fallback),
                 std::chrono::milliseconds(int64_t(timeoutSeconds * 1e3)), inlineBytes);
           }),
           py::arg("rank"), py::arg("size"), py::arg("comm"), py::arg("fallback"),
           py::arg("timeout_seconds"), py::arg("inline_bytes"))
      .def_property_readonly("inline_bytes", &MtxcommBackend::inlineBytes)
      .def_property_readonly("comm_address", &MtxcommBackend::commAddress)
      .def_property_readonly("fallback", &MtxcommBackend::fallbackObject)
      .def("pending", &MtxcommBackend::pending, py::call_guard<py::gil_scoped_release>())
      .def("allreduce_direct", &MtxcommBackend::allreduceDirect, py::arg("tensor"),
           py::arg("op") = int(MTXCOMM_SUM), py::call_guard<py::gil_scoped_release>())
      .def("bench_allreduce", &MtxcommBackend::benchAllreduce, py::arg("tensor"), py::arg("iters"),
           py::call_guard<py::gil_scoped_release>())
      .def("close", &MtxcommBackend::close, py::call_guard<py::gil_scoped_release>());
  py::class_<mtxcomm_torch::MtxcommProcessGroup, c10d::ProcessGroup,
             c10::intrusive_ptr<mtxcomm_torch::MtxcommProcessGroup>>(m, "ProcessGroup")
      .def(py::init([](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                       const c10::intrusive_ptr<MtxcommBackend>& backend) {
             return c10::make_intrusive<mtxcomm_torch::MtxcommProcessGroup>(store, rank, size,
                                                                            backend);
           }),
           py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("backend"));
}
