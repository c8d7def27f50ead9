// ferry._ferry: the Python extension over libferry's public C++ API. It speaks in addresses and
// sizes; the ferry package (ferry/client.py) turns torch tensors and numpy arrays into them.
// handles.hpp holds the buffer, event and transfer handles, py_client.* the Client.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <optional>
#include <string>

#include "ferry/client.hpp"
#include "ferry/version.hpp"
#include "python/src/dlpack.hpp"
#include "python/src/errors.hpp"
#include "python/src/handles.hpp"
#include "python/src/py_client.hpp"

namespace py = pybind11;

namespace ferry::python {
namespace {

// A DLPack capsule of `nbytes` uint8 over memory that `keep` keeps alive.
py::capsule ToDlpack(std::shared_ptr<void> keep, void* data, size_t nbytes, int device_type, int device_id) {
  return MakeDlpackCapsule(std::move(keep), data, static_cast<int64_t>(nbytes), device_type, device_id);
}

}  // namespace
}  // namespace ferry::python

PYBIND11_MODULE(_ferry, m) {
  using namespace ferry;
  using namespace ferry::python;
  m.doc() = "ferry's extension module: libferry's client API in addresses and sizes (use the ferry package)";
  RegisterErrorTranslator();
  m.attr("__version__") = kVersionString;
  m.attr("built_with_cuda") = kBuiltWithCuda;
  m.def("default_socket", &DefaultSocketPath, "The control socket used when none is given.");

  py::class_<PoolBuffer>(m, "PoolBuffer", py::buffer_protocol(), "A buffer of ferryd's pinned pool, mapped here.")
      .def_property_readonly("ptr", [](const PoolBuffer& b) { return reinterpret_cast<uintptr_t>(b.buffer->data()); })
      .def_readonly("nbytes", &PoolBuffer::nbytes)
      .def("dlpack", [](const PoolBuffer& b) {
        return ToDlpack(b.buffer, b.buffer->data(), b.nbytes, kDLCPU, 0);
      }, "A DLPack capsule (uint8, nbytes) over the buffer that keeps it alive.")
      .def_buffer([](PoolBuffer& b) {
        return py::buffer_info(b.buffer->data(), 1, py::format_descriptor<uint8_t>::format(), 1,
                               {static_cast<py::ssize_t>(b.nbytes)}, {1});
      });

  py::class_<DeviceBuffer>(m, "DeviceBuffer", "Device memory allocated by libferry (cudaMalloc, or the host backend's stand-in).")
      .def_property_readonly("ptr", [](const DeviceBuffer& b) { return reinterpret_cast<uintptr_t>(b.allocation->data()); })
      .def_readonly("nbytes", &DeviceBuffer::nbytes)
      .def_property_readonly("host_visible", [](const DeviceBuffer& b) { return b.allocation->host_visible(); })
      .def("dlpack", [](const DeviceBuffer& b) {
        return ToDlpack(b.allocation, b.allocation->data(), b.nbytes, b.device_type, b.device_id);
      }, "A DLPack capsule (uint8, nbytes) over the allocation that keeps it alive.");

  py::class_<PyEvent>(m, "Event", "An interprocess event shared with ferryd.")
      .def("record", &PyEvent::Record, py::arg("stream"), "Records the event on a CUDA stream (a cudaStream_t as int).")
      .def("record_after", &PyEvent::RecordAfter, py::arg("cuda_event"),
           "Records the event once another CUDA event (a cudaEvent_t as int) has happened, GPU-side.");

  py::class_<PyTransfer>(m, "Transfer", "One submitted copy.")
      .def("wait", &PyTransfer::Wait, py::arg("timeout") = py::none(), py::arg("spin") = false,
           "Blocks until done (GIL released); spin: poll, never sleep.")
      .def("done", &PyTransfer::Done, "True once done; raises the copy's error if it failed.")
      .def("stream_wait", &PyTransfer::StreamWait, py::arg("stream"), "Makes a CUDA stream wait for the copy on the GPU.")
      .def_property_readonly("nbytes", &PyTransfer::nbytes)
      .def_property_readonly("latency_ns", &PyTransfer::latency_ns);

  py::class_<PyClient>(m, "Client", "A session with ferryd.")
      .def(py::init<std::optional<std::string>, std::optional<std::string>, std::optional<double>, std::optional<int>>(),
           py::arg("socket") = py::none(), py::arg("name") = py::none(), py::arg("timeout") = 5.0,
           py::arg("device") = py::none())
      .def("close", &PyClient::Close)
      .def_property_readonly("closed", &PyClient::closed)
      .def_property_readonly("backend", &PyClient::backend)
      .def_property_readonly("device", &PyClient::device)
      .def_property_readonly("gpu_uuid", &PyClient::gpu_uuid)
      .def_property_readonly("numa_node", &PyClient::numa_node)
      .def_property_readonly("session_id", &PyClient::session_id)
      .def_property_readonly("socket", &PyClient::socket)
      .def("stats", &PyClient::Stats)
      .def("allocate_host", &PyClient::AllocateHost, py::arg("nbytes"))
      .def("allocate_device", &PyClient::AllocateDevice, py::arg("nbytes"))
      .def("create_event", &PyClient::CreateEvent)
      .def("copy", &PyClient::Copy, py::arg("dst"), py::arg("dst_cuda"), py::arg("src"), py::arg("src_cuda"),
           py::arg("nbytes"), py::arg("latency"), py::arg("stream_waitable"), py::arg("after").none(true),
           py::arg("after_cuda_event"), py::arg("stream"))
      .def("copy_blocks", &PyClient::CopyBlocks, py::arg("dst"), py::arg("dst_cuda"), py::arg("dst_nbytes"),
           py::arg("src"), py::arg("src_cuda"), py::arg("src_nbytes"), py::arg("src_index"), py::arg("dst_index"),
           py::arg("count"), py::arg("block_bytes"), py::arg("latency"), py::arg("stream_waitable"),
           py::arg("after").none(true),
           py::arg("after_cuda_event"), py::arg("stream"))
      .def("copy_staged", &PyClient::CopyStaged, py::arg("dst"), py::arg("dst_cuda"), py::arg("src"),
           py::arg("src_cuda"), py::arg("nbytes"))
      .def("stream_wait", &PyClient::StreamWait, py::arg("transfers"), py::arg("stream"))
      .def("forget_device_memory", &PyClient::ForgetDeviceMemory)
      .def("time_round_trips", &PyClient::TimeRoundTrips, py::arg("dst"), py::arg("dst_cuda"), py::arg("src"),
           py::arg("src_cuda"), py::arg("nbytes"), py::arg("iterations"), py::arg("latency") = true);
}
