// Child: a real process started with posix_spawn, its stdout and stderr captured to a file, for
// the tests that run ferryd and its clients the way an operator would.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace ferry::testing {

using namespace std::chrono_literals;

// A child process with its stdout (and optionally stderr) captured to a file.
class Child {
 public:
  Child(std::vector<std::string> argv, const std::string& out_path) : out_path_(out_path) {
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    std::vector<char*> args;
    for (auto& a : argv) args.push_back(a.data());
    args.push_back(nullptr);
    if (posix_spawn(&pid_, args[0], &fa, nullptr, args.data(), environ) != 0) pid_ = -1;
    posix_spawn_file_actions_destroy(&fa);
  }
  ~Child() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      Wait();
    }
  }
  pid_t pid() const { return pid_; }
  void Signal(int sig) { ::kill(pid_, sig); }
  // The raw wait status; -1 if it did not end within `timeout`.
  int Wait(std::chrono::milliseconds timeout = 30s) {
    for (auto end = std::chrono::steady_clock::now() + timeout; std::chrono::steady_clock::now() < end;) {
      int st = 0;
      if (::waitpid(pid_, &st, WNOHANG) == pid_) {
        pid_ = -1;
        return st;
      }
      std::this_thread::sleep_for(2ms);
    }
    return -1;
  }
  std::string Output() const {
    std::ifstream f(out_path_);
    return std::string(std::istreambuf_iterator<char>(f), {});
  }
  bool WaitForOutput(const std::string& needle, std::chrono::milliseconds timeout = 30s) {
    for (auto end = std::chrono::steady_clock::now() + timeout; std::chrono::steady_clock::now() < end;) {
      if (Output().find(needle) != std::string::npos) return true;
      std::this_thread::sleep_for(5ms);
    }
    return false;
  }

 private:
  pid_t pid_ = -1;
  std::string out_path_;
};

}  // namespace ferry::testing
