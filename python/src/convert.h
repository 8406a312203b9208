// Conversions at the module's edge: DLPack arrays <-> TensorView (no copy),
// host tensors -> torch tensors, Status -> Python exceptions. Nothing else.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstdint>
#include <exception>
#include <new>
#include <optional>
#include <string>

#include "moekit/status.h"
#include "moekit/tensor.h"

namespace moekit::python {

namespace nb = nanobind;

using Array = nb::ndarray<>;              // any framework, any device, any dtype (DLPack)
using OptArray = std::optional<Array>;

// A view of the array's memory (no copy). Fails with ValueError naming `name`
// when the dtype, rank or device is not one moekit knows.
TensorView view_of(const Array& a, const char* name);
TensorView view_of(const OptArray& a, const char* name);  // empty view for None

// A Python int argument checked as a Python int, before any narrowing: a bool
// or a non-integer is a TypeError, a value outside [lo, hi] (however large) a
// ValueError naming the argument and the value.
int64_t int_arg(const char* name, nb::handle v, int64_t lo, int64_t hi);

// The device named by ("cpu"|"cuda", index).
Device parse_device(const std::string& type, int index);

// Raises the Python exception of `status` (ValueError for bad input, RuntimeError
// for internal errors, OSError for I/O, MemoryError for allocations); no-op when ok.
void throw_if_error(const Status& status);

template <typename T>
T value_or_throw(StatusOr<T> s) {
  throw_if_error(s.status());
  return std::move(s).value();
}

// Runs fn() (returning Status) with the GIL released. Nothing in fn may touch
// Python: no nb::raise, no throw_if_error/value_or_throw, no nb::object. A C++
// exception escaping fn (std::bad_alloc from a vector, say) is turned into a
// Status here, still without the GIL, so every error leaves the released region
// as a value and is raised by the caller once the GIL is held again.
template <typename F>
Status without_gil(F&& fn) {
  nb::gil_scoped_release release;
  try {
    return fn();
  } catch (const std::bad_alloc&) {
    return ResourceExhausted("out of memory (std::bad_alloc)");
  } catch (const std::exception& e) {
    return Internal(std::string("unexpected C++ exception: ") + e.what());
  } catch (...) {
    return Internal("unexpected C++ exception");
  }
}

// A torch tensor that owns `t` (moved; no copy of the data).
nb::object to_torch(HostTensor t);

}  // namespace moekit::python
