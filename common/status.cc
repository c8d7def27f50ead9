#include "ferry/status.hpp"

#include <cstring>

namespace ferry {

std::string_view CodeName(Code code) {
  switch (code) {
    case Code::kOk: return "OK";
    case Code::kInvalidArgument: return "InvalidArgument";
    case Code::kNotFound: return "NotFound";
    case Code::kPermissionDenied: return "PermissionDenied";
    case Code::kResourceExhausted: return "ResourceExhausted";
    case Code::kUnavailable: return "Unavailable";
    case Code::kTimeout: return "Timeout";
    case Code::kProtocol: return "Protocol";
    case Code::kDevice: return "Device";
    case Code::kNotSupported: return "NotSupported";
    case Code::kInternal: return "Internal";
    case Code::kAborted: return "Aborted";
  }
  return "Unknown";
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  std::string s(CodeName(code_));
  s += ": ";
  s += message_;
  return s;
}

Status Status::WithContext(std::string_view context) const {
  if (ok()) return *this;
  return Status(code_, std::string(context) + ": " + message_);
}

Status ErrnoStatus(std::string_view what, int err) {
  Code code = Code::kInternal;
  switch (err) {
    case EACCES: case EPERM: code = Code::kPermissionDenied; break;
    case ENOENT: code = Code::kNotFound; break;
    case ENOMEM: case ENOSPC: case EMFILE: case ENFILE: code = Code::kResourceExhausted; break;
    case ECONNREFUSED: case ECONNRESET: case EPIPE: case ENOTCONN: code = Code::kUnavailable; break;
    case EINVAL: code = Code::kInvalidArgument; break;
    case ETIMEDOUT: case EAGAIN: code = Code::kTimeout; break;
    default: break;
  }
  return Status(code, std::string(what) + ": " + std::strerror(err));
}

}  // namespace ferry
