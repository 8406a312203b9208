// moekit's configuration in the terms of the fp64 reference
// (tests/reference/reference.h), which takes plain strings and numbers and
// includes no moekit header. The one place where tests translate one into the
// other.
#pragma once

#include <vector>

#include "moekit/config.h"
#include "reference/reference.h"

namespace moekit::testing {

// The reference's routing parameters for `routing`; `bias` is the exact
// score bias [E] (deepseek_v3), empty for none.
moekit_ref::RoutingParams ref_routing(const RoutingConfig& routing, std::vector<double> bias = {});

// The reference's layer parameters for `config` (activation, swiglu
// constants, E, H, I).
moekit_ref::LayerParams ref_layer(const MoeConfig& config);

}  // namespace moekit::testing
