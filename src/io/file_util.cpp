#include "io/file_util.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include "moekit/io.h"

namespace moekit::io {

Status os_error(const std::string& path, const char* what, int err) {
  std::string msg = path + ": " + what + ": " + std::strerror(err);
  if (err == ENOENT) return NotFound(std::move(msg));
  return IoError(std::move(msg));
}

InputFile::~InputFile() {
  if (file) std::fclose(file);
}

Status open_input(const std::string& path, InputFile* out) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return os_error(path, "cannot open", errno);
  if (!S_ISREG(st.st_mode)) return InvalidArgument(path + ": not a regular file");
  out->file = std::fopen(path.c_str(), "rb");
  if (!out->file) return os_error(path, "cannot open", errno);
  out->size = static_cast<uint64_t>(st.st_size);
  return Status::Ok();
}

Status read_exact(InputFile& f, void* dst, uint64_t n, const std::string& path) {
  if (n == 0) return Status::Ok();
  const size_t got = std::fread(dst, 1, n, f.file);
  if (got != n) {
    if (std::ferror(f.file)) return os_error(path, "read failed", errno);
    return DataLoss(path + ": file ended early (wanted " + std::to_string(n) + " bytes, got " +
                    std::to_string(got) + ")");
  }
  return Status::Ok();
}

StatusOr<std::unique_ptr<ByteSource>> ByteSource::map_file(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return os_error(path, "cannot open", errno);
  if (!S_ISREG(st.st_mode)) return InvalidArgument(path + ": not a regular file");
  std::unique_ptr<ByteSource> src(new ByteSource());
  src->size_ = static_cast<uint64_t>(st.st_size);
  if (src->size_ == 0) return src;  // mmap of 0 bytes is an error; an empty source is not
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return os_error(path, "cannot open", errno);
  void* p = ::mmap(nullptr, src->size_, PROT_READ, MAP_PRIVATE, fd, 0);
  const int err = errno;
  ::close(fd);
  if (p == MAP_FAILED) return os_error(path, "cannot map", err);
  src->mapped_ = p;
  src->data_ = static_cast<const uint8_t*>(p);
  return src;
}

std::unique_ptr<ByteSource> ByteSource::copy_of(const void* bytes, size_t size) {
  std::unique_ptr<ByteSource> src(new ByteSource());
  const auto* b = static_cast<const uint8_t*>(bytes);
  src->owned_.assign(b, b + size);
  src->data_ = src->owned_.data();
  src->size_ = size;
  return src;
}

ByteSource::~ByteSource() {
  if (mapped_) ::munmap(mapped_, size_);
}

namespace {

std::string temp_name_for(const std::string& path) {
  static std::atomic<uint64_t> counter{0};
  return path + ".tmp-" + std::to_string(::getpid()) + "-" + std::to_string(counter++);
}

Status write_temp(const std::string& tmp, const std::string& path, const std::vector<uint8_t>& bytes) {
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) return os_error(path, "cannot create", errno);
  bool ok = bytes.empty() || std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
  int err = ok ? 0 : errno;
  if (std::fclose(f) != 0 && ok) {
    ok = false;
    err = errno;
  }
  if (!ok) {
    std::remove(tmp.c_str());
    return os_error(path, "write failed", err);
  }
  return Status::Ok();
}

}  // namespace

Status write_file_atomic(const std::string& path, const std::vector<uint8_t>& bytes) {
  return write_files_atomic({{path, bytes}});
}

Status write_files_atomic(const std::vector<std::pair<std::string, std::vector<uint8_t>>>& files) {
  std::vector<std::string> temps;
  auto drop_temps = [&temps] {
    for (const std::string& t : temps) std::remove(t.c_str());
  };
  for (const auto& [path, bytes] : files) {
    std::string tmp = temp_name_for(path);
    Status s = write_temp(tmp, path, bytes);
    if (!s.ok()) {
      drop_temps();
      return s;
    }
    temps.push_back(std::move(tmp));
  }
  for (size_t i = 0; i < files.size(); ++i) {
    if (std::rename(temps[i].c_str(), files[i].first.c_str()) != 0) {
      const int err = errno;
      // Files renamed before this one stay; the rest are dropped.
      for (size_t j = i; j < temps.size(); ++j) std::remove(temps[j].c_str());
      return os_error(files[i].first, "cannot rename the temporary file into place", err);
    }
  }
  return Status::Ok();
}

}  // namespace moekit::io
