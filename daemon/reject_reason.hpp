// Why ferryd refused a request, as a bounded set: each is one label value of
// ferry_rejected_total{reason=...}, so the set must stay small and fixed (never a client name,
// pid or message).
#pragma once

#include <array>
#include <string_view>

#include "ferry/status.hpp"

namespace ferry::daemon {

enum class RejectReason {
  kExhausted,   // a limit or the pool is used up
  kPermission,  // the client may not do that
  kNotFound,    // no such region, event or buffer
  kProtocol,    // the client broke the protocol
  kInvalid,     // any other bad request
  kWaitReport,  // a wait report (exposed time) that was not believed
};

inline constexpr std::array kAllRejectReasons = {RejectReason::kExhausted, RejectReason::kPermission,
                                                 RejectReason::kNotFound,  RejectReason::kProtocol,
                                                 RejectReason::kInvalid,   RejectReason::kWaitReport};

// The metric label: "exhausted", "permission", "not_found", "protocol", "invalid", "wait_report".
constexpr std::string_view RejectReasonName(RejectReason r) {
  switch (r) {
    case RejectReason::kExhausted: return "exhausted";
    case RejectReason::kPermission: return "permission";
    case RejectReason::kNotFound: return "not_found";
    case RejectReason::kProtocol: return "protocol";
    case RejectReason::kInvalid: return "invalid";
    case RejectReason::kWaitReport: return "wait_report";
  }
  return "invalid";
}

// The reason a refused request's status stands for.
inline RejectReason RejectReasonFor(const Status& st) {
  switch (st.code()) {
    case Code::kResourceExhausted: return RejectReason::kExhausted;
    case Code::kPermissionDenied: return RejectReason::kPermission;
    case Code::kNotFound: return RejectReason::kNotFound;
    case Code::kProtocol: return RejectReason::kProtocol;
    default: return RejectReason::kInvalid;
  }
}

}  // namespace ferry::daemon
