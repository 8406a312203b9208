// _moekit: the extension module under the `moekit` Python package. It converts
// tensors and errors; every rule lives in the C++ library.
#include "bind.h"

NB_MODULE(_moekit, m) {
  m.doc() = "moekit's C++ library (use the `moekit` package, not this module)";
  moekit::python::bind_config(m);
  moekit::python::bind_layer(m);
  moekit::python::bind_capture(m);
  moekit::python::bind_checkpoint(m);
}
