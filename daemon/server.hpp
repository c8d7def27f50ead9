// ferryd's server: the control socket, the sessions, the rings and the event loop that feeds
// the backend. One thread runs Run(); Stop() may be called from any thread or a signal handler.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "daemon/backend.hpp"
#include "daemon/config.hpp"
#include "ferry/status.hpp"

namespace ferry::daemon {

struct ServerCounters {
  std::atomic<uint64_t> sessions{0};
  std::atomic<uint64_t> sessions_total{0};
  std::atomic<uint64_t> copies_completed{0};
  std::atomic<uint64_t> copies_failed{0};
  std::atomic<uint64_t> bytes_h2d{0};
  std::atomic<uint64_t> bytes_d2h{0};
  std::atomic<uint64_t> evictions{0};
  std::atomic<uint64_t> rejected{0};
  std::atomic<uint64_t> pool_free_bytes{0};
  std::atomic<uint64_t> in_flight{0};
};

class Server {
 public:
  // Creates the pool, registers it with the backend, and listens on config.SocketPath().
  static Result<std::unique_ptr<Server>> Create(const DaemonConfig& config, std::unique_ptr<Backend> backend);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Serves until Stop(); then evicts every session, waits for in-flight copies, and removes the
  // socket. Returns an error only if the loop itself failed.
  Status Run();
  void Stop();  // async-signal-safe

  const DaemonConfig& config() const;
  const ServerCounters& counters() const;
  Backend& backend();
  uint64_t pool_bytes() const;

  class Impl;

 private:
  explicit Server(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ferry::daemon
