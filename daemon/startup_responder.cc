#include "daemon/startup_responder.hpp"

#include <poll.h>
#include <sys/socket.h>

#include <chrono>
#include <system_error>

#include "common/channel.hpp"
#include "common/status_macros.hpp"

namespace ferry::daemon {
namespace {

constexpr int kHelloWaitMs = 200;  // a connection that says nothing by then is closed

}  // namespace

Result<std::unique_ptr<StartupResponder>> StartupResponder::Start(int listen_fd, std::string progress) {
  FERRY_ASSIGN_OR_RETURN(UniqueFd stop, CreateEventFd());
  auto r = std::unique_ptr<StartupResponder>(new StartupResponder(listen_fd, std::move(stop), std::move(progress)));
  try {
    r->thread_ = std::thread([p = r.get()] { p->Main(); });
  } catch (const std::system_error& e) {
    return ResourceExhausted(std::string("cannot start the start-up responder thread: ") + e.what());
  }
  return r;
}

StartupResponder::StartupResponder(int listen_fd, UniqueFd stop_efd, std::string progress)
    : listen_fd_(listen_fd), stop_efd_(std::move(stop_efd)), progress_(std::move(progress)) {}

StartupResponder::~StartupResponder() {
  if (thread_.joinable()) {
    RingDoorbell(stop_efd_.get());
    thread_.join();
  }
}

void StartupResponder::SetProgress(std::string progress) {
  std::lock_guard<std::mutex> l(mu_);
  progress_ = std::move(progress);
}

uint64_t StartupResponder::answered() const {
  std::lock_guard<std::mutex> l(mu_);
  return answered_;
}

void StartupResponder::Main() {
  for (;;) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {stop_efd_.get(), POLLIN, 0}};
    if (::poll(fds, 2, -1) < 0) continue;  // EINTR
    if (fds[1].revents != 0) return;
    if (fds[0].revents == 0) continue;
    auto conn = AcceptUnix(listen_fd_);
    if (!conn.ok()) {  // nothing queued after all, or out of fds: the next poll tries again, soon
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      continue;
    }
    Answer(conn->get());
  }
}

void StartupResponder::Answer(int fd) {
  auto m = RecvMessage(fd, kHelloWaitMs);
  if (!m.ok() || m->type() != wire::MsgType::kHello) return;
  wire::HelloReply r{};
  std::string text;
  {
    std::lock_guard<std::mutex> l(mu_);
    text = "ferryd is starting: " + progress_;
    ++answered_;
  }
  r.status = ToWire(Unavailable(text));
  r.status.flags = wire::kReplyStarting;
  (void)Send(fd, wire::MsgType::kHelloReply, m->header.seq, r);
}

}  // namespace ferry::daemon
