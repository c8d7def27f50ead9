// ferry's Status codes as Python exceptions: FerryError carries a Status out of the C++ code
// (it touches nothing of Python, so it may be thrown with the GIL released); the translator
// raises the class ferry._errors names for its code, with ferry's message.
#pragma once

#include <pybind11/pybind11.h>

#include <exception>
#include <string>

#include "ferry/status.hpp"

namespace ferry::python {

struct FerryError : std::exception {
  explicit FerryError(Status s) : status(std::move(s)) {}
  const char* what() const noexcept override { return status.message().c_str(); }
  Status status;
};

inline void ThrowIfError(const Status& st) {
  if (!st.ok()) throw FerryError(st);
}

inline void RegisterErrorTranslator() {
  pybind11::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const FerryError& e) {
      namespace py = pybind11;
      py::object cls = py::module_::import("ferry._errors").attr("error_class")(static_cast<int>(e.status.code()));
      py::object exc = cls(e.status.message(), static_cast<int>(e.status.code()), std::string(CodeName(e.status.code())));
      PyErr_SetObject(cls.ptr(), exc.ptr());
    }
  });
}

}  // namespace ferry::python
