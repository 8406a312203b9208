// Tensor files: NumPy .npy and safetensors, read and written on the host.
// Formats and conventions (bf16 in .npy, what is rejected): docs/io.md.
//
// Every reader validates the whole file before returning anything; every
// writer validates its inputs, writes a temporary file next to the target and
// renames it, so a failed write never leaves a half-written file behind.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "moekit/config.h"
#include "moekit/status.h"
#include "moekit/tensor.h"

namespace moekit::io {

// ---------------------------------------------------------------- .npy

// How a bf16 tensor is stored in a .npy file (NumPy has no bfloat16).
enum class Bf16Storage : uint8_t {
  kAsF32,  // '<f4': exact widening, readable by any NumPy (the default)
  kRaw,    // '<u2': the raw bf16 bits (half the size; reads back as bf16)
};

struct NpyWriteOptions {
  Bf16Storage bf16 = Bf16Storage::kAsF32;
};

// Reads a C-order .npy (format 1.0, 2.0 or 3.0). dtypes: '<f4' -> f32,
// '<f2' -> f16, '<i4' -> i32, '<i2' -> i16, '|u1' -> u8, and the raw bf16
// forms '<u2' / '|V2' -> bf16. Rank <= kMaxRank.
StatusOr<HostTensor> read_npy(const std::string& path);
// The same from bytes in memory; `name` labels error messages.
StatusOr<HostTensor> parse_npy(const void* bytes, size_t size, std::string_view name);

// What a .npy file holds, checked as read_npy checks it (header, and data
// exactly as long as the shape needs) without reading the data: to size a
// job before loading it.
struct NpyInfo {
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
};
StatusOr<NpyInfo> read_npy_info(const std::string& path);

// Writes a contiguous host tensor (f32, f16, bf16, i32, i16, u8; f8_e4m3 is
// widened to '<f4'). Atomic: nothing is left at `path` on failure.
Status write_npy(const std::string& path, const TensorView& t, const NpyWriteOptions& opts = {});
// The complete file contents write_npy would write.
StatusOr<std::vector<uint8_t>> encode_npy(const TensorView& t, const NpyWriteOptions& opts = {});

// ---------------------------------------------------------------- safetensors

struct NamedTensor {
  std::string name;
  TensorView tensor;  // contiguous, host
  // Optional: the safetensors dtype to write the bytes under instead of the
  // view's ("U16" for i16 bits that are unsigned in the file); same element size.
  std::string stored_dtype;
  // Optional, with stored_dtype: the tensor's shape in the file, for bytes of a
  // dtype moekit does not load (I64, F64, ...): `tensor` is then a u8 view of
  // exactly element size x numel(stored_shape) bytes.
  std::optional<std::vector<int64_t>> stored_shape;
};

// One tensor entry of a safetensors header, validated against the file.
struct SafetensorsEntry {
  std::string name;
  std::string dtype_name;      // as in the file: "BF16", "F32", ...
  std::optional<DType> dtype;  // empty: a valid safetensors dtype moekit does not load (F64, I64, ...)
  std::vector<int64_t> shape;
  uint64_t offset = 0;  // bytes from the start of the data section
  uint64_t nbytes = 0;
};

class SafetensorsFile;
namespace detail {
// SafetensorsFile::open with `between` run after the file is mapped and before
// its header is read: the moment tests truncate it at.
StatusOr<SafetensorsFile> open_safetensors(const std::string& path, const std::function<void()>& between);
}  // namespace detail

// A safetensors file, memory-mapped and validated on open: header length,
// JSON, every entry's dtype, shape and offsets (in range, size = numel x
// element size, no two tensors overlapping). The length and header are copied
// out through pread() and the size checked again before open() returns, so a
// file cut meanwhile is DataLoss, not SIGBUS. Move-only; views returned by
// view() live as long as this object.
class SafetensorsFile {
 public:
  static StatusOr<SafetensorsFile> open(const std::string& path);
  // The same over bytes in memory (copied); `name` labels error messages.
  static StatusOr<SafetensorsFile> parse(const void* bytes, size_t size, std::string_view name);
  // The same without the copy: `bytes` must stay alive and unchanged as long
  // as the returned object (a caller's image of tensors it holds).
  static StatusOr<SafetensorsFile> parse_borrowed(const void* bytes, size_t size, std::string_view name);
  // Tensors the caller holds in memory, read as a borrowed image of them
  // without one (no copy, no header): each a contiguous host view that must
  // stay alive and unchanged as long as the returned object. An entry's dtype
  // and shape are the view's, or its stored_dtype/stored_shape (bytes of a
  // dtype moekit does not load). Names must be unique and non-empty.
  static StatusOr<SafetensorsFile> of_views(const std::vector<NamedTensor>& tensors, std::string_view name);

  SafetensorsFile(SafetensorsFile&&) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&&) noexcept;
  ~SafetensorsFile();

  const std::string& path() const { return path_; }
  // Made by parse_borrowed: the caller's bytes, which outlive this object by
  // contract, so its tensors may be used in place (TensorFiles::read_in_place).
  bool borrowed() const { return borrowed_; }
  // The "__metadata__" string map (empty when the file has none).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // Entries in data-offset order.
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }
  bool contains(std::string_view name) const { return find(name) != nullptr; }
  const SafetensorsEntry* find(std::string_view name) const;

  // A zero-copy view into the file. Fails when the tensor is missing, has a
  // dtype moekit does not load, rank > kMaxRank, or its data is not aligned to
  // its element size in memory (then use read()).
  StatusOr<TensorView> view(std::string_view name) const;
  // An aligned copy; same checks as view() except alignment.
  StatusOr<HostTensor> read(std::string_view name) const;
  // The raw bytes of any entry, also of a dtype moekit does not load (U16, ...):
  // entry->nbytes bytes, live as long as this object.
  // Checked: view() and bytes() fail (DataLoss) when the file has been
  // truncated below the tensor since it was opened; read() and copy_bytes()
  // read through pread(), so a truncation at any time is an error, never SIGBUS.
  // NOTE: a truncation between view()/bytes() and the caller's reads of the
  // pointer still raises SIGBUS (the mapping cannot be guarded); copy instead.
  StatusOr<const uint8_t*> bytes(std::string_view name) const;
  // The raw bytes of any entry, copied through the checked path.
  StatusOr<std::vector<uint8_t>> copy_bytes(std::string_view name) const;

 private:
  uint64_t data_start() const;  // the data section's offset in the file
  struct Mapping;
  SafetensorsFile() = default;
  static StatusOr<SafetensorsFile> from_mapping(std::unique_ptr<Mapping> mapping, std::string path);
  friend StatusOr<SafetensorsFile> detail::open_safetensors(const std::string&, const std::function<void()>&);
  StatusOr<const SafetensorsEntry*> loadable(std::string_view name) const;

  std::string path_;
  bool borrowed_ = false;
  std::unique_ptr<Mapping> mapping_;
  const uint8_t* data_ = nullptr;  // start of the data section
  std::map<std::string, std::string> metadata_;
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, size_t, std::less<>> index_;  // name -> position in entries_ (find() in O(log n))
};


// Writes tensors (f32, f16, bf16, f8_e4m3, i32, i16, u8) in the given order,
// with an optional "__metadata__" map. Names must be unique, non-empty and not
// "__metadata__". Atomic like write_npy.
Status write_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                         const std::map<std::string, std::string>& metadata = {});
StatusOr<std::vector<uint8_t>> encode_safetensors(const std::vector<NamedTensor>& tensors,
                                                  const std::map<std::string, std::string>& metadata = {});

// ---------------------------------------------------------------- shared helpers

// Writes bytes to `path` through a temporary file and a rename.
Status write_file_atomic(const std::string& path, const std::vector<uint8_t>& bytes);

// Writes several files so that either all of them appear or none does (as far
// as the OS allows): every temporary is written first, then all are renamed.
Status write_files_atomic(const std::vector<std::pair<std::string, std::vector<uint8_t>>>& files);

// A host copy of `t` converted to `dtype` (float types among themselves, exact
// when widening; ints among themselves when the values fit).
StatusOr<HostTensor> convert(const TensorView& t, DType dtype);

// One weight matrix w [N, K] (f32|bf16, finite) quantized for an fp8 scheme
// (docs/fp8.md): scale = max(amax, 1e-10) / 448 in f32 per 128x128 block
// (fp8_block128: scale [ceil(N/128), ceil(K/128)], the checkpoints'
// weight_scale_inv) or per matrix (fp8_per_tensor: scale [1], weight_scale);
// weight = e4m3(w / scale) [N, K] f8_e4m3, round to nearest even. Real value =
// weight * scale.
struct Fp8Matrix {
  HostTensor weight;  // [N, K] f8_e4m3
  HostTensor scale;   // f32, shape above
};
StatusOr<Fp8Matrix> quantize_fp8(const TensorView& w, QuantMethod method, std::string_view name);

// Weights w [..., K] (f32|bf16, finite, host, contiguous; rows independent)
// quantized for a 4-bit scheme (mxfp4, int4_g32, int4_g128; docs/weights_4bit.md):
// packed [..., K/2] u8, two values a byte (low nibble = even column), and
// scale [..., K/group], u8 E8M0 exponents (mxfp4) or f32 (int4), as the
// layer's MoeWeights take them (kernel.h). Errors name `name`: K not a multiple
// of the group, a value not finite, another method.
struct Weight4Tensor {
  HostTensor packed;  // u8
  HostTensor scale;   // u8 (mxfp4) | f32 (int4)
};
StatusOr<Weight4Tensor> quantize_weight4_tensor(const TensorView& w, QuantMethod method, std::string_view name);

}  // namespace moekit::io
