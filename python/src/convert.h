// Conversions at the module's edge: DLPack arrays <-> TensorView (no copy),
// host tensors -> torch tensors, Status -> Python exceptions. Nothing else.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstdint>
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

// A torch tensor that owns `t` (moved; no copy of the data).
nb::object to_torch(HostTensor t);

}  // namespace moekit::python
