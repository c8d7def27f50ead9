// The extension's handles on libferry objects: pool buffers, device buffers, events, transfers.
//
// Ownership: a PoolBuffer or DeviceBuffer holds its libferry handle by shared_ptr; every tensor
// or array made over it (a DLPack capsule, the buffer protocol) holds that shared_ptr too, so the
// memory stays mapped while any view of it lives, even after the Client is closed. Freeing one
// is a round trip to ferryd, made without the GIL (SharedWithoutGil).
#pragma once

#include <pybind11/pybind11.h>

#include <chrono>
#include <cmath>
#include <memory>
#include <optional>
#include <string>

#include "ferry/client.hpp"
#include "python/src/dlpack.hpp"
#include "python/src/errors.hpp"

namespace ferry::python {

using Clock = std::chrono::steady_clock;

// `owned` in a shared_ptr whose deleter lets go of the GIL, if the freeing thread holds it,
// while the object's destructor talks to ferryd: a freed numpy array must not stall every
// Python thread for a round trip (or for a stopped ferryd's timeout).
template <typename T>
std::shared_ptr<T> SharedWithoutGil(std::unique_ptr<T> owned) {
  return std::shared_ptr<T>(owned.release(), [](T* p) {
    std::unique_ptr<T> doomed(p);
    if (Py_IsInitialized() != 0 && PyGILState_Check() != 0) {
      pybind11::gil_scoped_release nogil;
      doomed.reset();
    }
  });
}

struct PoolBuffer {
  std::shared_ptr<HostBuffer> buffer;
  size_t nbytes = 0;  // what was asked (the pool may have rounded up)
};

struct DeviceBuffer {
  std::shared_ptr<DeviceAllocation> allocation;
  size_t nbytes = 0;
  int device_type = kDLCPU;  // kDLCUDA on the cuda backend
  int device_id = 0;
};

// A timeout in seconds from Python: None, inf or beyond a billion seconds is no limit; NaN or a
// negative number is refused.
inline std::optional<Clock::duration> TimeoutFromSeconds(std::optional<double> seconds, const char* what) {
  if (!seconds || *seconds >= 1e9) return std::nullopt;
  if (std::isnan(*seconds) || *seconds < 0) {
    ThrowIfError(InvalidArgument(std::string(what) + " must be a number of seconds >= 0, or None"));
  }
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(*seconds));
}

class PyEvent {
 public:
  explicit PyEvent(SharedEvent e) : event_(std::move(e)) {}
  void Record(uintptr_t stream) {
    Status st;
    {
      pybind11::gil_scoped_release nogil;
      st = event_.Record(reinterpret_cast<void*>(stream));
    }
    ThrowIfError(st);
  }
  void RecordAfter(uintptr_t cuda_event) {
    Status st;
    {
      pybind11::gil_scoped_release nogil;
      st = event_.RecordAfter(reinterpret_cast<void*>(cuda_event));
    }
    ThrowIfError(st);
  }
  SharedEvent& event() { return event_; }

 private:
  SharedEvent event_;
};

class PyTransfer {
 public:
  PyTransfer(Transfer t, size_t nbytes) : t_(std::move(t)), nbytes_(nbytes) {}
  // Waits in slices so that Ctrl-C reaches Python while the GIL is released. `spin`: polls
  // without ever sleeping (see Transfer.wait).
  void Wait(std::optional<double> timeout_s, bool spin) {
    const std::optional<Clock::duration> limit = TimeoutFromSeconds(timeout_s, "timeout");
    const Clock::time_point deadline = limit ? Clock::now() + *limit : Clock::time_point::max();
    if (spin) {
      SpinUntilDone(deadline, timeout_s);
      return;
    }
    for (;;) {
      const auto slice = std::min<Clock::duration>(deadline - Clock::now(), std::chrono::milliseconds(100));
      Status st;
      {
        pybind11::gil_scoped_release nogil;
        st = t_.Wait(std::chrono::duration_cast<std::chrono::microseconds>(std::max(slice, Clock::duration::zero())));
      }
      if (st.ok()) return;
      if (st.code() != Code::kTimeout) ThrowIfError(st);
      if (Clock::now() >= deadline) {
        ThrowIfError(Timeout("copy not done after " + std::to_string(*timeout_s) + " s (Transfer.wait's timeout)"));
      }
      if (PyErr_CheckSignals() != 0) throw pybind11::error_already_set();
    }
  }
  void SpinUntilDone(Clock::time_point deadline, std::optional<double> timeout_s) {
    for (;;) {
      Result<bool> done = Status();
      {
        pybind11::gil_scoped_release nogil;
        const Clock::time_point slice_end = std::min(deadline, Clock::now() + std::chrono::milliseconds(100));
        do {
          done = t_.Poll();
        } while (done.ok() && !*done && Clock::now() < slice_end);
      }
      ThrowIfError(done.status());
      if (*done) return;
      if (Clock::now() >= deadline) {
        ThrowIfError(Timeout("copy not done after " + std::to_string(*timeout_s) + " s (Transfer.wait's timeout)"));
      }
      if (PyErr_CheckSignals() != 0) throw pybind11::error_already_set();
    }
  }
  bool Done() {
    Result<bool> r = t_.Poll();
    ThrowIfError(r.status());
    return *r;
  }
  void StreamWait(uintptr_t stream) {
    Status st;
    {
      pybind11::gil_scoped_release nogil;
      st = t_.StreamWait(reinterpret_cast<void*>(stream));
    }
    ThrowIfError(st);
  }
  size_t nbytes() const { return nbytes_; }
  int64_t latency_ns() const { return t_.latency().count(); }
  Transfer& transfer() { return t_; }

 private:
  Transfer t_;
  size_t nbytes_;
};

}  // namespace ferry::python
