#include "util/temp_dir.h"

#include <unistd.h>

#include <algorithm>

namespace moekit::testing {

ScopedTempDir::ScopedTempDir() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string name = "moekit_" + std::string(info->test_suite_name()) + "_" + std::to_string(::getpid()) + "_" +
                     info->name();
  // Parameterized tests carry '/' in their names: one folder, not a nested
  // path whose parents would outlive the test.
  std::replace(name.begin(), name.end(), '/', '_');
  path_ = std::filesystem::temp_directory_path() / name;
  std::filesystem::remove_all(path_);
  std::filesystem::create_directories(path_);
}

ScopedTempDir::~ScopedTempDir() {
  std::error_code ignored;  // a destructor must not throw
  std::filesystem::remove_all(path_, ignored);
}

}  // namespace moekit::testing
