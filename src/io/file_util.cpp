#include "io/file_util.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <new>
#include <optional>
#include <stdexcept>

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
  struct stat fst {};
  if (::fstat(fd, &fst) != 0 || static_cast<uint64_t>(fst.st_size) < src->size_) {
    // Shorter than stat() said a moment ago: map no page past the end.
    const int err = errno;
    ::close(fd);
    if (fst.st_size >= 0 && static_cast<uint64_t>(fst.st_size) < src->size_) {
      return DataLoss(path + ": the file shrank while it was being opened (being written by another process?)");
    }
    return os_error(path, "cannot check", err);
  }
  void* p = ::mmap(nullptr, src->size_, PROT_READ, MAP_PRIVATE, fd, 0);
  const int err = errno;
  if (p == MAP_FAILED) {
    ::close(fd);
    return os_error(path, "cannot map", err);
  }
  src->fd_ = fd;
  src->path_ = path;
  src->mapped_ = p;
  src->data_ = static_cast<const uint8_t*>(p);
  return src;
}

Status ByteSource::read(uint64_t offset, uint64_t n, void* dst) const {
  if (n == 0) return Status::Ok();
  if (offset > size_ || n > size_ - offset) {
    return OutOfRange(path_ + ": bytes [" + std::to_string(offset) + ", +" + std::to_string(n) + ") past its " +
                      std::to_string(size_) + " bytes");
  }
  if (fd_ < 0) {
    std::memcpy(dst, data_ + offset, n);
    return Status::Ok();
  }
  auto* out = static_cast<uint8_t*>(dst);
  uint64_t done = 0;
  while (done < n) {
    const size_t chunk = static_cast<size_t>(std::min<uint64_t>(n - done, uint64_t{1} << 30));
    const ssize_t got = ::pread(fd_, out + done, chunk, static_cast<off_t>(offset + done));
    if (got < 0) {
      if (errno == EINTR) continue;
      return os_error(path_, "read failed", errno);
    }
    if (got == 0) {
      return DataLoss(path_ + ": the file ends at byte " + std::to_string(offset + done) + ", but it had " +
                      std::to_string(size_) + " bytes when it was opened (truncated while moekit had it open?)");
    }
    done += static_cast<uint64_t>(got);
  }
  return Status::Ok();
}

Status ByteSource::check_intact(uint64_t end) const {
  if (fd_ < 0) return Status::Ok();
  struct stat st {};
  if (::fstat(fd_, &st) != 0) return os_error(path_, "cannot check", errno);
  if (static_cast<uint64_t>(st.st_size) < end) {
    return DataLoss(path_ + ": the file is now " + std::to_string(st.st_size) + " bytes, but it had " +
                    std::to_string(size_) + " when it was opened (truncated while moekit had it open?)");
  }
  return Status::Ok();
}

std::unique_ptr<ByteSource> ByteSource::copy_of(const void* bytes, size_t size) {
  std::unique_ptr<ByteSource> src(new ByteSource());
  const auto* b = static_cast<const uint8_t*>(bytes);
  src->owned_.assign(b, b + size);
  src->data_ = src->owned_.data();
  src->size_ = size;
  return src;
}

std::unique_ptr<ByteSource> ByteSource::borrow(const void* bytes, size_t size) {
  std::unique_ptr<ByteSource> src(new ByteSource());
  src->data_ = static_cast<const uint8_t*>(bytes);
  src->size_ = size;
  return src;
}

ByteSource::~ByteSource() {
  if (mapped_) ::munmap(mapped_, size_);
  if (fd_ >= 0) ::close(fd_);
}

StatusOr<HostTensor> allocate_host_tensor(DType dtype, const std::vector<int64_t>& shape, const std::string& name) {
  try {
    return HostTensor(dtype, shape);
  } catch (const std::bad_alloc&) {
  } catch (const std::length_error&) {
  }
  double bytes = static_cast<double>(dtype_size(dtype));
  for (int64_t d : shape) bytes *= static_cast<double>(d);
  char what[64];
  std::snprintf(what, sizeof what, "%.3g GiB", bytes / (1ull << 30));
  return ResourceExhausted(name + ": cannot allocate " + what + " for its data");
}

namespace {

namespace fs = std::filesystem;

// A name for a staging or backup file in the folder of `path`: a fixed short
// prefix and 10 random characters, never longer than the folder's own path plus
// 16, so an output whose name is as long as the file system allows still has
// one (the old "<name>.tmp-<pid>-<n>" did not fit beside a 250-character name).
// Not created here: write_temp creates it exclusively (O_EXCL) and link() fails
// on an existing name, so a collision is an error, never an overwrite.
std::string temp_name_for(const std::string& path) {
  static std::atomic<uint64_t> counter{0};
  static const char kChars[] = "0123456789abcdefghijklmnopqrstuvwxyz";
  uint64_t x = (static_cast<uint64_t>(::getpid()) << 32) ^ (counter.fetch_add(1) * 0x9e3779b97f4a7c15ull) ^
               static_cast<uint64_t>(reinterpret_cast<uintptr_t>(&counter)) ^
               static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  std::string name = ".mk-";
  for (int i = 0; i < 10; ++i) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 29;
    name += kChars[x % 36];
  }
  const fs::path parent = fs::path(path).parent_path();
  return parent.empty() ? name : (parent / name).string();
}

Status write_temp(std::string& tmp, const std::string& path, const std::vector<uint8_t>& bytes) {
  int fd = -1;
  for (int attempt = 0; attempt < 16 && fd < 0; ++attempt) {
    if (attempt > 0) tmp = temp_name_for(path);
    fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0 && errno != EEXIST) break;
  }
  if (fd < 0) return os_error(path, "cannot create a temporary file beside it", errno);
  std::FILE* f = ::fdopen(fd, "wb");
  if (!f) {
    const int err = errno;
    ::close(fd);
    ::unlink(tmp.c_str());
    return os_error(path, "cannot create", err);
  }
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

// One output of write_files_atomic through its commit.
struct Target {
  const std::string* path = nullptr;
  std::string temp;       // the staged contents, renamed onto *path by the commit
  std::string backup;     // the file *path held before, kept until every output is in place
  bool existed = false;
  bool moved_away = false;  // the backup was made by a rename (no hard links here), not a link
  bool committed = false;
};

// The same file twice: equal after resolving symlinks and "..", or one inode.
std::string identity(const std::string& path) {
  std::error_code ec;
  fs::path p = fs::weakly_canonical(fs::absolute(path, ec), ec);
  if (ec) p = fs::path(path).lexically_normal();
  return p.string();
}

// Everything a rename could refuse, and two outputs naming one file, checked
// before any file is written.
Status check_destinations(const std::vector<std::pair<std::string, std::vector<uint8_t>>>& files,
                          std::vector<Target>* targets) {
  struct Seen {
    std::string id;
    std::optional<std::pair<dev_t, ino_t>> inode;  // when the file exists
  };
  std::vector<Seen> seen;
  for (const auto& [path, bytes] : files) {
    if (path.empty()) return InvalidArgument("output path is empty");
    Target t;
    t.path = &path;
    Seen me{identity(path), std::nullopt};
    struct stat st {};
    if (::stat(path.c_str(), &st) == 0) {
      if (S_ISDIR(st.st_mode)) return InvalidArgument(path + ": is a directory, not a file");
      if (!S_ISREG(st.st_mode)) return InvalidArgument(path + ": not a regular file, cannot be replaced");
      t.existed = true;
      me.inode = std::pair{st.st_dev, st.st_ino};
    } else if (errno != ENOENT) {
      return os_error(path, "cannot check", errno);
    } else if (path.back() == '/') {
      return InvalidArgument(path + ": names a folder, not a file");
    }
    std::string parent = fs::path(path).parent_path().string();
    if (parent.empty()) parent = ".";
    struct stat pst {};
    if (::stat(parent.c_str(), &pst) != 0 || !S_ISDIR(pst.st_mode)) {
      return NotFound(path + ": folder '" + parent + "' does not exist");
    }
    for (size_t j = 0; j < seen.size(); ++j) {
      if (seen[j].id == me.id || (me.inode && seen[j].inode == me.inode)) {
        return InvalidArgument(path + ": the same file as output '" + *(*targets)[j].path + "'");
      }
    }
    seen.push_back(std::move(me));
    targets->push_back(std::move(t));
  }
  return Status::Ok();
}

// Puts back what `t` replaced (or removes what it created). False when the OS refused.
bool restore(Target& t) {
  bool ok = true;
  if (t.committed || t.moved_away) {
    if (t.existed) {
      ok = ::rename(t.backup.c_str(), t.path->c_str()) == 0;
    } else {
      ok = ::unlink(t.path->c_str()) == 0;
    }
  }
  if (!t.backup.empty()) ::unlink(t.backup.c_str());  // a link to the file still in place
  return ok;
}

Status commit(std::vector<Target>& targets, detail::RenameFn rename_fn) {
  for (size_t i = 0; i < targets.size(); ++i) {
    Target& t = targets[i];
    int err = 0;
    if (t.existed) {
      // Keep the old file under another name until every output is in place.
      t.backup = temp_name_for(*t.path);
      int linked = ::link(t.path->c_str(), t.backup.c_str());
      for (int attempt = 0; linked != 0 && errno == EEXIST && attempt < 16; ++attempt) {
        t.backup = temp_name_for(*t.path);  // that name is taken: another
        linked = ::link(t.path->c_str(), t.backup.c_str());
      }
      if (linked != 0) {
        t.moved_away = ::rename(t.path->c_str(), t.backup.c_str()) == 0;
        if (!t.moved_away) {
          err = errno;
          t.backup.clear();
        }
      }
    }
    if (err == 0 && rename_fn(t.temp.c_str(), t.path->c_str()) != 0) err = errno;
    if (err != 0) {
      bool restored = true;
      for (size_t j = i + 1; j-- > 0;) restored &= restore(targets[j]);
      for (size_t j = i; j < targets.size(); ++j) ::unlink(targets[j].temp.c_str());
      return os_error(*t.path, restored ? "cannot put the new file in place; no output was changed"
                                        : "cannot put the new file in place, and restoring the earlier outputs "
                                          "failed too",
                      err);
    }
    t.committed = true;
  }
  for (Target& t : targets) {
    if (!t.backup.empty()) ::unlink(t.backup.c_str());
  }
  return Status::Ok();
}

int os_rename(const char* from, const char* to) { return std::rename(from, to); }

}  // namespace

Status write_file_atomic(const std::string& path, const std::vector<uint8_t>& bytes) {
  return write_files_atomic({{path, bytes}});
}

Status write_files_atomic(const std::vector<std::pair<std::string, std::vector<uint8_t>>>& files) {
  return detail::write_files_atomic(files, os_rename);
}

namespace detail {

// Check every destination, stage every file, then commit: a failed call
// leaves every existing file as it was and no new file behind.
Status write_files_atomic(const std::vector<std::pair<std::string, std::vector<uint8_t>>>& files, RenameFn rename_fn) {
  std::vector<Target> targets;
  targets.reserve(files.size());
  MOEKIT_RETURN_IF_ERROR(check_destinations(files, &targets));
  for (size_t i = 0; i < files.size(); ++i) {
    targets[i].temp = temp_name_for(files[i].first);
    const Status s = write_temp(targets[i].temp, files[i].first, files[i].second);
    if (!s.ok()) {
      for (size_t j = 0; j < i; ++j) ::unlink(targets[j].temp.c_str());
      return s;
    }
  }
  return commit(targets, rename_fn);
}

}  // namespace detail

}  // namespace moekit::io
