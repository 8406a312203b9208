// The tensors of one checkpoint by name: a single safetensors file (a layer
// file) or a model folder's shards (model.safetensors, or the shards that
// model.safetensors.index.json names). Shards are opened (mapped) on first
// use, so only those of the asked layer are touched.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "moekit/io.h"
#include "moekit/status.h"
#include "moekit/tensor.h"

namespace moekit::io {

class TensorFiles {
 public:
  // A model folder's weights (as save_pretrained writes them).
  static StatusOr<TensorFiles> open_folder(const std::string& dir);
  // One file, already open.
  static TensorFiles of_file(SafetensorsFile file);

  // Every tensor name, sorted, with the file that holds it.
  const std::map<std::string, std::string>& names() const { return where_; }
  bool contains(const std::string& name) const { return where_.count(name) != 0; }
  // The names that start with `prefix`, sorted.
  std::vector<std::string> names_under(const std::string& prefix) const;

  StatusOr<const SafetensorsEntry*> entry(const std::string& name);
  // The same, or nullptr when no file holds `name`.
  StatusOr<const SafetensorsEntry*> find(const std::string& name);
  StatusOr<HostTensor> read(const std::string& name);
  // The same without a copy when the file is a borrowed image
  // (SafetensorsFile::borrowed) and the tensor is aligned: a HostTensor::borrowed
  // over the caller's bytes, which must then outlive it. Else read().
  StatusOr<HostTensor> read_in_place(const std::string& name);
  // The raw bytes of any entry, also of a dtype moekit does not load (I64, ...).
  StatusOr<std::vector<uint8_t>> copy_bytes(const std::string& name);
  // The files read so far (shard names in a folder, the path of a single file).
  std::vector<std::string> files_used() const;
  // For messages: the folder or the file.
  const std::string& where() const { return dir_; }

 private:
  StatusOr<SafetensorsFile*> file_of(const std::string& name);

  std::string dir_;  // the folder; for a single file its path, and `open_` holds it under ""
  bool single_ = false;
  std::map<std::string, std::string> where_;     // tensor name -> shard file
  std::map<std::string, SafetensorsFile> open_;  // shard file -> mapping
};

}  // namespace moekit::io
