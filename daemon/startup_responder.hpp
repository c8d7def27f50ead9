// While ferryd builds its pool (seconds for tens of GiB, minutes for hundreds), its socket
// already accepts connections: each hello is refused with kUnavailable, flagged
// wire::kReplyStarting, and a message saying how far the start got. libferry waits and tries
// again until its connect timeout; `ferryctl status` prints the progress at once.
//
// Threading: its own thread serves the socket; SetProgress from any thread. It does not own the
// listening socket, which the server takes over once the responder is gone.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "common/fd.hpp"
#include "ferry/status.hpp"

namespace ferry::daemon {

class StartupResponder {
 public:
  static Result<std::unique_ptr<StartupResponder>> Start(int listen_fd, std::string progress);
  ~StartupResponder();  // stops the thread; connections it has not accepted stay queued
  StartupResponder(const StartupResponder&) = delete;
  StartupResponder& operator=(const StartupResponder&) = delete;

  void SetProgress(std::string progress);
  uint64_t answered() const;  // hellos refused so far

 private:
  StartupResponder(int listen_fd, UniqueFd stop_efd, std::string progress);
  void Main();
  void Answer(int fd);

  const int listen_fd_;
  UniqueFd stop_efd_;
  mutable std::mutex mu_;
  std::string progress_;  // guarded by mu_
  uint64_t answered_ = 0;  // guarded by mu_
  std::thread thread_;
};

}  // namespace ferry::daemon
