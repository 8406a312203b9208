// Status and StatusOr: the one error path of the public API. Nothing is thrown
// across it; every failure carries a code and a message naming the problem.
#pragma once

#include <cassert>
#include <string>
#include <utility>
#include <variant>

namespace moekit {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,     // wrong shape, dtype, value, or configuration field
  kOutOfRange,          // an index (expert id, layer, row) outside its range
  kUnsupported,         // a valid request this kernel/backend cannot serve
  kFailedPrecondition,  // called in the wrong lifecycle state
  kNotFound,            // a named thing (file, tensor, backend) does not exist
  kDataLoss,            // a file is truncated or inconsistent
  kIoError,             // the OS refused a read or write
  kResourceExhausted,   // an allocation failed
  kInternal,            // a bug or a device error
  kDeadlineExceeded,    // a peer (another rank) did not answer in time
};

const char* status_code_name(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // ok
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return {}; }
  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "InvalidArgument: top_k (9) must be <= num_experts (8)"
  std::string to_string() const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status InvalidArgument(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }
inline Status OutOfRange(std::string m) { return {StatusCode::kOutOfRange, std::move(m)}; }
inline Status Unsupported(std::string m) { return {StatusCode::kUnsupported, std::move(m)}; }
inline Status FailedPrecondition(std::string m) { return {StatusCode::kFailedPrecondition, std::move(m)}; }
inline Status NotFound(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
inline Status DataLoss(std::string m) { return {StatusCode::kDataLoss, std::move(m)}; }
inline Status IoError(std::string m) { return {StatusCode::kIoError, std::move(m)}; }
inline Status ResourceExhausted(std::string m) { return {StatusCode::kResourceExhausted, std::move(m)}; }
inline Status Internal(std::string m) { return {StatusCode::kInternal, std::move(m)}; }
inline Status DeadlineExceeded(std::string m) { return {StatusCode::kDeadlineExceeded, std::move(m)}; }

// A value or the Status that explains why there is none.
template <typename T>
class [[nodiscard]] StatusOr {
 public:
  StatusOr(Status status) : v_(std::move(status)) { assert(!std::get<Status>(v_).ok()); }
  StatusOr(T value) : v_(std::move(value)) {}

  bool ok() const { return std::holds_alternative<T>(v_); }
  Status status() const { return ok() ? Status::Ok() : std::get<Status>(v_); }
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  std::variant<Status, T> v_;
};

}  // namespace moekit

#define MOEKIT_CONCAT_INNER_(a, b) a##b
#define MOEKIT_CONCAT_(a, b) MOEKIT_CONCAT_INNER_(a, b)

#define MOEKIT_RETURN_IF_ERROR(expr)                  \
  do {                                                \
    ::moekit::Status moekit_status_ = (expr);         \
    if (!moekit_status_.ok()) return moekit_status_;  \
  } while (0)

#define MOEKIT_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                  \
  if (!tmp.ok()) return tmp.status();                 \
  lhs = std::move(tmp).value()

// MOEKIT_ASSIGN_OR_RETURN(auto x, make_x());
#define MOEKIT_ASSIGN_OR_RETURN(lhs, expr) \
  MOEKIT_ASSIGN_OR_RETURN_IMPL_(MOEKIT_CONCAT_(moekit_statusor_, __LINE__), lhs, expr)
