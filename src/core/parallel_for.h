// parallel_for is public API now (include/moekit/parallel_for.h); this path is
// kept for the CPU benchmark, which still includes it from src/.
#pragma once

#include "moekit/parallel_for.h"
