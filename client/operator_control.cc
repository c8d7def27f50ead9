#include "client/operator_control.hpp"

#include <unistd.h>

#include <cerrno>
#include <thread>

#include "common/status_macros.hpp"
#include "common/yaml_util.hpp"
#include "common/socket_path.hpp"

namespace ferry::ctl {

Status Control::Open(const std::string& socket, std::chrono::milliseconds wait_for_start) {
  wire::HelloRequest h{};
  h.client_version = wire::kVersion;
  CopyCString(h.name, "ferryctl");
  // Not waiting for the start: one hello, which waits as long as any other call.
  const bool wait = wait_for_start.count() > 0;
  const auto timeout = wait ? wait_for_start : std::chrono::milliseconds(10000);
  FERRY_ASSIGN_OR_RETURN(Greeting g, HelloUntilReady(socket.empty() ? DefaultFerrydSocket() : socket, h, timeout,
                                                     wait ? std::chrono::milliseconds(50) : timeout));
  const auto reply = g.reply.As<wire::HelloReply>();
  FERRY_RETURN_IF_ERROR(FromWire(reply.status));
  sock_ = std::move(g.sock);
  seq_ = 1;
  backend_ = static_cast<wire::BackendKind>(reply.backend);
  return Status::Ok();
}

Result<wire::StatsReply> Control::Stats() {
  FERRY_ASSIGN_OR_RETURN(ReceivedMessage m, Call(wire::MsgType::kStats, wire::StatsRequest{}));
  if (m.type() != wire::MsgType::kStatsReply) return ProtocolError("unexpected reply to stats");
  const auto r = m.As<wire::StatsReply>();
  FERRY_RETURN_IF_ERROR(FromWire(r.status));
  return r;
}

Result<wire::GpuStatsReply> Control::GpuStats(uint32_t gpu) {
  FERRY_ASSIGN_OR_RETURN(ReceivedMessage m, Call(wire::MsgType::kGpuStats, wire::GpuStatsRequest{gpu, 0}));
  if (m.type() != wire::MsgType::kGpuStatsReply) return ProtocolError("unexpected reply to GPU stats");
  const auto r = m.As<wire::GpuStatsReply>();
  FERRY_RETURN_IF_ERROR(FromWire(r.status));
  return r;
}

Result<std::string> Control::RunningPolicyText(bool as_yaml) {
  wire::GetPolicyRequest req{};
  req.format = as_yaml ? wire::kPolicyFormatYaml : wire::kPolicyFormatCanonical;
  FERRY_ASSIGN_OR_RETURN(ReceivedMessage m, Call(wire::MsgType::kGetPolicy, req));
  if (m.type() != wire::MsgType::kPolicyReply) return ProtocolError("unexpected reply");
  FERRY_RETURN_IF_ERROR(FromWire(m.As<wire::PolicyReply>().status));
  if (m.fds.size() != 1) return ProtocolError("policy reply without its text");
  return ReadWholeFd(m.fds[0].get(), yamlutil::kMaxYamlBytes);
}

Result<PolicyInfo> Control::RunningPolicy() {
  FERRY_ASSIGN_OR_RETURN(ReceivedMessage m, Call(wire::MsgType::kGetPolicy, wire::GetPolicyRequest{}));
  if (m.type() != wire::MsgType::kPolicyReply) return ProtocolError("unexpected reply");
  auto r = m.As<wire::PolicyReply>();
  FERRY_RETURN_IF_ERROR(FromWire(r.status));
  return PolicyInfo{ReadCString(r.name), ReadCString(r.hash), ""};
}

Result<PolicyInfo> Control::ApplyPolicyFd(int fd, const std::string& source, bool dry_run) {
  wire::ApplyPolicyRequest req{};
  CopyCString(req.source, source);
  req.dry_run = dry_run ? 1 : 0;
  FERRY_ASSIGN_OR_RETURN(ReceivedMessage m, Call(wire::MsgType::kApplyPolicy, req, fd));
  if (m.type() != wire::MsgType::kPolicyReply) return ProtocolError("unexpected reply");
  auto r = m.As<wire::PolicyReply>();
  FERRY_RETURN_IF_ERROR(FromWire(r.status));
  return PolicyInfo{ReadCString(r.name), ReadCString(r.hash), ReadCString(r.previous_hash)};
}

Result<PolicyInfo> Control::ApplyPolicyText(const std::string& text, const std::string& source, bool dry_run) {
  FERRY_ASSIGN_OR_RETURN(UniqueFd fd, CreateSealedMemfd("ferry-policy", text.size()));
  if (::pwrite(fd.get(), text.data(), text.size(), 0) != static_cast<ssize_t>(text.size())) {
    return ErrnoStatus("pwrite", errno);
  }
  return ApplyPolicyFd(fd.get(), source, dry_run);
}

}  // namespace ferry::ctl
