// ferry::Status and ferry::Result<T>: the error currency at every boundary of ferry.
// Nothing in ferry throws across its API; every fallible call returns one of these.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

#include "ferry/export.h"

namespace ferry {

enum class Code : int32_t {
  kOk = 0,
  kInvalidArgument = 1,   // the caller passed something wrong
  kNotFound = 2,          // no such buffer, region, event, file
  kPermissionDenied = 3,  // peer credentials or file modes refused it
  kResourceExhausted = 4, // pool, ring or quota full: back off and retry
  kUnavailable = 5,       // the daemon is not there or went away
  kTimeout = 6,           // a wait ran out
  kProtocol = 7,          // a peer broke the wire protocol
  kDevice = 8,            // the GPU or its driver failed
  kNotSupported = 9,      // not built in, or not on this backend
  kInternal = 10,         // a bug in ferry
  kAborted = 11,          // the operation was cancelled (session ended, shutdown)
};

FERRY_EXPORT std::string_view CodeName(Code code);

class [[nodiscard]] FERRY_EXPORT Status {
 public:
  Status() = default;
  Status(Code code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return {}; }
  bool ok() const { return code_ == Code::kOk; }
  Code code() const { return code_; }
  const std::string& message() const { return message_; }
  // "ResourceExhausted: pool has 0 free bytes, 4096 asked"
  std::string ToString() const;
  // Prefixes context: Status("open x").WithContext("config") -> "config: open x".
  Status WithContext(std::string_view context) const;

 private:
  Code code_ = Code::kOk;
  std::string message_;
};

inline Status InvalidArgument(std::string m) { return {Code::kInvalidArgument, std::move(m)}; }
inline Status NotFound(std::string m) { return {Code::kNotFound, std::move(m)}; }
inline Status PermissionDenied(std::string m) { return {Code::kPermissionDenied, std::move(m)}; }
inline Status ResourceExhausted(std::string m) { return {Code::kResourceExhausted, std::move(m)}; }
inline Status Unavailable(std::string m) { return {Code::kUnavailable, std::move(m)}; }
inline Status Timeout(std::string m) { return {Code::kTimeout, std::move(m)}; }
inline Status ProtocolError(std::string m) { return {Code::kProtocol, std::move(m)}; }
inline Status DeviceError(std::string m) { return {Code::kDevice, std::move(m)}; }
inline Status NotSupported(std::string m) { return {Code::kNotSupported, std::move(m)}; }
inline Status Internal(std::string m) { return {Code::kInternal, std::move(m)}; }
inline Status Aborted(std::string m) { return {Code::kAborted, std::move(m)}; }
// errno-based: "what: strerror(errno)"
FERRY_EXPORT Status ErrnoStatus(std::string_view what, int err);

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}          // NOLINT(google-explicit-constructor)
  Result(Status status) : v_(std::move(status)) {}   // NOLINT(google-explicit-constructor)

  bool ok() const { return std::holds_alternative<T>(v_); }
  const Status& status() const {
    static const Status kOkStatus;
    return ok() ? kOkStatus : std::get<Status>(v_);
  }
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace ferry
