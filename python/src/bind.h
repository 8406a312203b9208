// The parts of the _moekit extension module, one per public header group.
#pragma once

#include <nanobind/nanobind.h>

namespace moekit::python {

void bind_config(nanobind::module_& m);   // MoeConfig
void bind_layer(nanobind::module_& m);    // Layer, Model, select_backend, route, platform
void bind_capture(nanobind::module_& m);  // capturer, bind, replayer, capture files
void bind_checkpoint(nanobind::module_& m);  // load_checkpoint_layer (model folders)

}  // namespace moekit::python
