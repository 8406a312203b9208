// A fresh, empty folder per test under the system's temporary directory, named
// after the suite, the test and the process, and removed when it goes out of
// scope.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <string>

namespace moekit::testing {

class ScopedTempDir {
 public:
  // Call inside a running test (the name comes from its test info).
  ScopedTempDir();
  ~ScopedTempDir();
  ScopedTempDir(const ScopedTempDir&) = delete;
  ScopedTempDir& operator=(const ScopedTempDir&) = delete;

  const std::filesystem::path& path() const { return path_; }
  // The path of `name` inside the folder.
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

// A fixture whose tests each get their own ScopedTempDir.
class TempDirTest : public ::testing::Test {
 protected:
  std::string file(const std::string& name) const { return dir_.file(name); }
  ScopedTempDir dir_;
};

}  // namespace moekit::testing
