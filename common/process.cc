#include "common/process.hpp"

#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

namespace ferry {

std::string ExecutableDir() {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return ".";
  std::string p(buf, static_cast<size_t>(n));
  return p.substr(0, p.rfind('/'));
}

int RunProgram(const std::vector<std::string>& argv, const std::string& prefix) {
  std::vector<std::string> copy = argv;
  std::vector<char*> c;
  for (auto& s : copy) c.push_back(s.data());
  c.push_back(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    ::execvp(c[0], c.data());
    std::fprintf(stderr, "%s: exec %s: %s\n", prefix.c_str(), c[0], std::strerror(errno));
    ::_exit(127);
  }
  int st = 0;
  while (::waitpid(pid, &st, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

}  // namespace ferry
