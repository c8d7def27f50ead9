// Reads and parses policy files on a thread of its own, one file at a time, so that a slow
// file (a large one, a FIFO, a file on a stalled mount) never holds up the event loop and the
// copies it feeds. The loop submits loads and, when done_fd() is readable, takes the finished
// ones, in the order it submitted them, and applies them itself.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/fd.hpp"
#include "policy/policy.hpp"
#include "ferry/status.hpp"

namespace ferry::daemon {

struct PolicyLoad {
  // What to read: `path` (a reload: opened on the worker) or else `fd` (a file ferryctl sent).
  std::string path;
  UniqueFd fd;
  std::string name;  // names the file in errors
  // The caller's, carried back untouched: who asked, and how to answer.
  bool reload = false;
  uint64_t session_id = 0;
  uint32_t seq = 0;
  bool dry_run = false;
  std::string source;
  // The outcome: a policy, or why there is none.
  Status status = Internal("not loaded yet");
  std::shared_ptr<const Policy> policy;
};

class PolicyLoader {
 public:
  // `before_parse` (tests: may be null) runs on the worker before each file is read.
  static Result<std::unique_ptr<PolicyLoader>> Create(std::function<void(const std::string& name)> before_parse);
  ~PolicyLoader();  // waits for the file being read, drops the others
  PolicyLoader(const PolicyLoader&) = delete;
  PolicyLoader& operator=(const PolicyLoader&) = delete;

  static constexpr size_t kMaxQueued = 16;
  // false: kMaxQueued loads already wait. A reload while another reload still waits is
  // folded into that one (both would read the same file).
  bool Submit(PolicyLoad load);
  int done_fd() const { return done_efd_.get(); }
  std::vector<PolicyLoad> TakeDone();

 private:
  PolicyLoader() = default;
  void Work();
  void Load(PolicyLoad& load);

  std::function<void(const std::string&)> before_parse_;
  UniqueFd done_efd_;
  std::mutex mu_;
  std::condition_variable wake_;
  std::deque<PolicyLoad> waiting_;  // guarded by mu_
  std::vector<PolicyLoad> done_;    // guarded by mu_
  bool stopping_ = false;           // guarded by mu_
  std::thread worker_;
};

}  // namespace ferry::daemon
