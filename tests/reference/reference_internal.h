// Pieces the reference's own files share (not part of its interface).
#pragma once

#include <vector>

#include "reference.h"

namespace moekit_ref {

// act(z) of length I for z = W13[e] x (2I values when gated, I for relu2).
std::vector<double> activate(const LayerParams& p, const std::vector<double>& z);

}  // namespace moekit_ref
