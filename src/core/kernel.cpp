#include <sstream>

#include "moekit/kernel.h"

namespace moekit {

std::string ProblemSize::to_string() const {
  std::ostringstream os;
  os << "{E=" << num_experts << ", M=" << num_tokens << ", N=" << n << ", K=" << k << ", topk=" << top_k << "}";
  return os.str();
}

}  // namespace moekit
