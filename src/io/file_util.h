// File plumbing shared by the tensor-file readers and writers: opening with
// errors that name the path, read-only mappings, atomic writes.
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "moekit/status.h"
#include "moekit/tensor.h"

namespace moekit::io {

// A host tensor for data about to be read from `name`: ResourceExhausted,
// naming the bytes, when the allocation fails (no exception leaves a reader).
StatusOr<HostTensor> allocate_host_tensor(DType dtype, const std::vector<int64_t>& shape, const std::string& name);

// The Status for a failed OS call on `path` (NotFound for a missing file,
// IoError otherwise), with strerror(err) in the message.
Status os_error(const std::string& path, const char* what, int err);

// A regular file opened for reading, with its size.
struct InputFile {
  std::FILE* file = nullptr;
  uint64_t size = 0;
  InputFile() = default;
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;
  ~InputFile();
};
Status open_input(const std::string& path, InputFile* out);
// Reads exactly n bytes at the current position.
Status read_exact(InputFile& f, void* dst, uint64_t n, const std::string& path);

// Read-only bytes of a whole file: an mmap of it, an owned copy, or the caller's
// memory (SafetensorsFile::parse, parse_borrowed).
class ByteSource {
 public:
  static StatusOr<std::unique_ptr<ByteSource>> map_file(const std::string& path);
  static std::unique_ptr<ByteSource> copy_of(const void* bytes, size_t size);
  // The caller's bytes, not copied: they must outlive this object.
  static std::unique_ptr<ByteSource> borrow(const void* bytes, size_t size);
  ~ByteSource();
  ByteSource(const ByteSource&) = delete;
  ByteSource& operator=(const ByteSource&) = delete;

  const uint8_t* data() const { return data_; }
  uint64_t size() const { return size_; }

  // Copies bytes [offset, offset + n) to dst through a checked path: from a
  // mapped file with pread(), so a file truncated since it was mapped gives
  // DataLoss instead of the SIGBUS a read of the mapping would raise.
  Status read(uint64_t offset, uint64_t n, void* dst) const;
  // DataLoss unless the file still holds bytes [0, end) (fstat; a copy always
  // does). Call right before handing out pointers into the mapping.
  // NOTE: a truncation after this check and before the pointer is read still
  // raises SIGBUS; readers that copy use read() instead, which has no such gap.
  Status check_intact(uint64_t end) const;

 private:
  ByteSource() = default;
  const uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
  void* mapped_ = nullptr;      // mmap base, or nullptr
  int fd_ = -1;                 // the mapped file, kept open for read() and check_intact()
  std::string path_;            // for messages
  std::vector<uint8_t> owned_;  // used when not mapped
};

namespace detail {
// write_files_atomic with the rename it commits with, so tests can make a
// commit fail half way and check that the earlier files were restored.
using RenameFn = int (*)(const char* from, const char* to);
Status write_files_atomic(const std::vector<std::pair<std::string, std::vector<uint8_t>>>& files, RenameFn rename_fn);
}  // namespace detail

}  // namespace moekit::io
