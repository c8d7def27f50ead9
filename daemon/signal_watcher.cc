#include "daemon/signal_watcher.hpp"

#include <poll.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <system_error>

#include "common/log.hpp"

namespace ferry::daemon {
namespace {

sigset_t WatchedSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGHUP);
  return set;
}

}  // namespace

Result<std::unique_ptr<SignalWatcher>> SignalWatcher::Start() {
  const sigset_t set = WatchedSignals();
  if (const int rc = pthread_sigmask(SIG_BLOCK, &set, nullptr); rc != 0) {
    return Internal(std::string("blocking SIGTERM, SIGINT and SIGHUP: ") + std::strerror(rc));
  }
  UniqueFd signals(::signalfd(-1, &set, SFD_CLOEXEC));
  if (!signals.valid()) return Internal(std::string("signalfd: ") + std::strerror(errno));
  auto quit = CreateEventFd();
  if (!quit.ok()) return quit.status();
  try {
    return std::unique_ptr<SignalWatcher>(new SignalWatcher(std::move(signals), std::move(*quit)));
  } catch (const std::system_error& e) {
    return Internal(std::string("the signal watcher's thread: ") + e.what());
  }
}

SignalWatcher::SignalWatcher(UniqueFd signals, UniqueFd quit)
    : signal_fd_(std::move(signals)), quit_fd_(std::move(quit)), thread_([this] { Watch(); }) {}

SignalWatcher::~SignalWatcher() {
  RingDoorbell(quit_fd_.get());
  thread_.join();
}

void SignalWatcher::Attach(SignalActions actions) {
  std::lock_guard<std::mutex> lock(mu_);
  actions_ = std::move(actions);
  if (stop_.load() && actions_.stop) actions_.stop();
  if (reload_pending_ && actions_.reload) {
    actions_.reload();
    reload_pending_ = false;
  }
}

void SignalWatcher::Watch() {
  pollfd fds[2] = {{.fd = signal_fd_.get(), .events = POLLIN, .revents = 0},
                   {.fd = quit_fd_.get(), .events = POLLIN, .revents = 0}};
  // A watcher that can no longer read the signals stops ferryd: they stay blocked in every
  // thread, so nothing but SIGKILL would end it otherwise.
  auto give_up = [this](const char* what) {
    FERRY_LOG(kError) << "signals: " << what << ": " << std::strerror(errno)
                      << "; stopping, as SIGTERM, SIGINT and SIGHUP can no longer be heard";
    std::lock_guard<std::mutex> lock(mu_);
    stop_.store(true);
    if (actions_.stop) actions_.stop();
  };
  for (;;) {
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return give_up("poll");
    }
    if (fds[1].revents != 0) return;
    signalfd_siginfo info{};
    const ssize_t n = ::read(signal_fd_.get(), &info, sizeof info);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n != static_cast<ssize_t>(sizeof info)) return give_up("reading the signalfd");
    std::lock_guard<std::mutex> lock(mu_);
    if (info.ssi_signo == SIGHUP) {
      if (actions_.reload) {
        actions_.reload();
      } else {
        reload_pending_ = true;
      }
    } else {
      stop_.store(true);
      if (actions_.stop) actions_.stop();
    }
  }
}

}  // namespace ferry::daemon
