// How many fds ferryd has open against its limit, for the messages of a failure that may be
// for want of them.
#pragma once

#include <sys/resource.h>

#include <filesystem>
#include <string>
#include <system_error>

namespace ferry::daemon {

inline std::string FdUsage() {
  rlimit rl{};
  ::getrlimit(RLIMIT_NOFILE, &rl);
  std::error_code ec;
  size_t open = 0;
  for (auto it = std::filesystem::directory_iterator("/proc/self/fd", ec); !ec && it != std::filesystem::directory_iterator();
       it.increment(ec)) {
    ++open;
  }
  // The listing counts the fd it reads /proc/self/fd through.
  return (ec || open == 0 ? std::string("?") : std::to_string(open - 1)) + " fds open, RLIMIT_NOFILE " +
         std::to_string(rl.rlim_cur);
}

}  // namespace ferry::daemon
