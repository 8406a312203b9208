#include "io/tensor_files.h"

#include <filesystem>

#include "io/file_util.h"
#include "io/json_strict.h"

namespace moekit::io {
namespace {

namespace fs = std::filesystem;

StatusOr<std::string> read_index(const std::string& path) {
  InputFile f;
  MOEKIT_RETURN_IF_ERROR(open_input(path, &f));
  if (f.size > (uint64_t{256} << 20)) return InvalidArgument(path + ": larger than 256 MiB, not an index file");
  std::string text(static_cast<size_t>(f.size), '\0');
  MOEKIT_RETURN_IF_ERROR(read_exact(f, text.data(), f.size, path));
  return text;
}

}  // namespace

StatusOr<TensorFiles> TensorFiles::open_folder(const std::string& dir) {
  TensorFiles s;
  s.dir_ = dir;
  const std::string index = dir + "/model.safetensors.index.json";
  const std::string single = dir + "/model.safetensors";
  std::error_code ec;
  if (fs::exists(index, ec)) {
    MOEKIT_ASSIGN_OR_RETURN(const std::string text, read_index(index));
    MOEKIT_ASSIGN_OR_RETURN(const nlohmann::json j, parse_json_strict(text, index));
    if (!j.is_object() || !j.contains("weight_map") || !j.at("weight_map").is_object()) {
      return InvalidArgument(index + ": no \"weight_map\" object (tensor name -> shard file)");
    }
    for (const auto& [name, file] : j.at("weight_map").items()) {
      if (!file.is_string() || file.get<std::string>().find('/') != std::string::npos) {
        return InvalidArgument(index + ": weight_map[\"" + name + "\"] must be a shard file name in the folder");
      }
      s.where_[name] = file.get<std::string>();
    }
  } else if (fs::exists(single, ec)) {
    MOEKIT_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::open(single));
    for (const SafetensorsEntry& e : file.entries()) s.where_[e.name] = "model.safetensors";
    s.open_.emplace("model.safetensors", std::move(file));
  } else {
    return NotFound(dir + ": no model.safetensors or model.safetensors.index.json (safetensors weights as "
                          "save_pretrained writes them)");
  }
  return s;
}

TensorFiles TensorFiles::of_file(SafetensorsFile file) {
  TensorFiles s;
  s.dir_ = file.path();
  s.single_ = true;
  for (const SafetensorsEntry& e : file.entries()) s.where_[e.name] = "";
  s.open_.emplace("", std::move(file));
  return s;
}

std::vector<std::string> TensorFiles::names_under(const std::string& prefix) const {
  std::vector<std::string> v;
  for (auto it = where_.lower_bound(prefix); it != where_.end() && it->first.starts_with(prefix); ++it) {
    v.push_back(it->first);
  }
  return v;
}

StatusOr<const SafetensorsEntry*> TensorFiles::entry(const std::string& name) {
  MOEKIT_ASSIGN_OR_RETURN(SafetensorsFile * f, file_of(name));
  const SafetensorsEntry* e = f->find(name);
  if (e == nullptr) return DataLoss(f->path() + ": the index lists " + name + " in this shard, but it is not there");
  return e;
}

StatusOr<const SafetensorsEntry*> TensorFiles::find(const std::string& name) {
  if (!contains(name)) return static_cast<const SafetensorsEntry*>(nullptr);
  return entry(name);
}

StatusOr<HostTensor> TensorFiles::read(const std::string& name) {
  MOEKIT_ASSIGN_OR_RETURN(SafetensorsFile * f, file_of(name));
  return f->read(name);
}

StatusOr<HostTensor> TensorFiles::read_in_place(const std::string& name) {
  MOEKIT_ASSIGN_OR_RETURN(SafetensorsFile * f, file_of(name));
  if (f->borrowed()) {
    if (StatusOr<TensorView> v = f->view(name); v.ok()) {
      std::vector<int64_t> shape(v->shape.begin(), v->shape.begin() + v->rank);
      return HostTensor::borrowed(v->dtype, std::move(shape), v->data);
    }
  }
  return f->read(name);
}

StatusOr<std::vector<uint8_t>> TensorFiles::copy_bytes(const std::string& name) {
  MOEKIT_ASSIGN_OR_RETURN(SafetensorsFile * f, file_of(name));
  return f->copy_bytes(name);
}

std::vector<std::string> TensorFiles::files_used() const {
  std::vector<std::string> out;
  for (const auto& [file, mapping] : open_) out.push_back(single_ ? mapping.path() : file);
  return out;
}

StatusOr<SafetensorsFile*> TensorFiles::file_of(const std::string& name) {
  auto w = where_.find(name);
  if (w == where_.end()) return NotFound(dir_ + ": no tensor " + name);
  auto it = open_.find(w->second);
  if (it == open_.end()) {
    MOEKIT_ASSIGN_OR_RETURN(SafetensorsFile f, SafetensorsFile::open(dir_ + "/" + w->second));
    it = open_.emplace(w->second, std::move(f)).first;
  }
  return &it->second;
}

}  // namespace moekit::io
