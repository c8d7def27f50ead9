// ferryd's SIGTERM, SIGINT and SIGHUP, taken on a thread of their own.
//
// Start blocks them in the calling thread, and every thread started after it (ferryd's, the
// CUDA driver's, the metrics server's) inherits that, so no handler ever runs on an arbitrary
// thread at an arbitrary point: the watcher reads them from a signalfd. A signal that came
// before the server was attached (systemd may stop ferryd while it builds its pool) is kept,
// and Attach hands it over; stop_requested() answers at any time, from any thread.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "common/fd.hpp"
#include "ferry/status.hpp"

namespace ferry::daemon {

// What a signal asks of the running server (Server::Stop, Server::RequestReload); each is called
// on the watcher's thread.
struct SignalActions {
  std::function<void()> stop;    // SIGTERM, SIGINT
  std::function<void()> reload;  // SIGHUP
};

class SignalWatcher {
 public:
  // Call before any other thread is started.
  static Result<std::unique_ptr<SignalWatcher>> Start();
  ~SignalWatcher();
  SignalWatcher(const SignalWatcher&) = delete;
  SignalWatcher& operator=(const SignalWatcher&) = delete;

  bool stop_requested() const { return stop_.load(); }  // a SIGTERM or SIGINT came
  // Later signals go to `actions`; a stop or reload that came before is handed to them now.
  // Detach before what they call is destroyed.
  void Attach(SignalActions actions);
  void Detach() { Attach({}); }

 private:
  SignalWatcher(UniqueFd signals, UniqueFd quit);
  void Watch();

  UniqueFd signal_fd_, quit_fd_;
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  SignalActions actions_;        // guarded by mu_
  bool reload_pending_ = false;  // guarded by mu_: a SIGHUP came while nothing was attached
  std::thread thread_;           // last: started once the rest is made
};

}  // namespace ferry::daemon
