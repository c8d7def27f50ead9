// The operator's side of ferryd's control socket (the slow path, no rings): the running
// policy, and applying a new one. Used by ferryctl and by the benchmarks that switch policies.
#pragma once

#include <chrono>
#include <string>

#include "common/channel.hpp"
#include "common/fd.hpp"
#include "common/status_macros.hpp"
#include "ferry/status.hpp"

namespace ferry::ctl {

struct PolicyInfo {
  std::string name, hash, previous_hash;
};

class Control {
 public:
  // Connects and says hello as an operator: a session with no device of its own, so
  // neither this library nor its users need the CUDA runtime. Empty: the default socket.
  // wait_for_start: how long to wait for a ferryd that is still starting (building its pool)
  // before giving up with its progress (kUnavailable); 0: at once (ferryctl status says how far it got).
  Status Open(const std::string& socket, std::chrono::milliseconds wait_for_start = std::chrono::seconds(30));
  wire::BackendKind backend() const { return backend_; }  // after Open
  template <typename T>
  Result<ReceivedMessage> Call(wire::MsgType type, const T& req, int fd = -1) {
    FERRY_RETURN_IF_ERROR(Send(sock_.get(), type, ++seq_, req, fd >= 0 ? &fd : nullptr, fd >= 0 ? 1 : 0));
    return RecvMessage(sock_.get(), 10000, Sender::kFerryd);
  }

  // The running policy: its canonical form (what `policy show` prints), or a policy file that
  // parses back to it (to put it back after a benchmark switched policies).
  Result<std::string> RunningPolicyText(bool as_yaml = false);
  Result<PolicyInfo> RunningPolicy();
  // Validates (and unless dry_run, applies) a policy file's text; `source` names it in errors
  // and in ferryd's log.
  Result<PolicyInfo> ApplyPolicyText(const std::string& text, const std::string& source, bool dry_run = false);
  Result<PolicyInfo> ApplyPolicyFd(int fd, const std::string& source, bool dry_run = false);
  // What ferryd is doing (ferryctl status).
  Result<wire::StatsReply> Stats();
  // One GPU's share (0 .. StatsReply::reserved - 1).
  Result<wire::GpuStatsReply> GpuStats(uint32_t gpu);

 private:
  UniqueFd sock_;
  uint32_t seq_ = 0;
  wire::BackendKind backend_ = wire::BackendKind::kHost;
};

}  // namespace ferry::ctl
