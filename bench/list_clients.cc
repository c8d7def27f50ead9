#include "bench/list_clients.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <optional>
#include <sstream>
#include <thread>

#include "common/cli.hpp"
#include "common/fd.hpp"

extern char** environ;

namespace ferry::bench {
namespace {

using namespace std::chrono_literals;

constexpr const char* kListClientUsage =
    R"(usage: ferry-bench list-client --socket PATH --index I [--device N] [--lists K]

One client of `ferry-bench transfer --clients N`, which starts it: it connects to ferryd, takes a
pool buffer and a device region as large as the largest of the first K lists of the blocks
section (default 3: 4096 x 16 KiB, 2048 x 64 KiB, 512 x 256 KiB), says "hello" on stdout, and
then reads commands on stdin, one a line, answering each on stdout:
  list W D   set up list W (0 .. K-1) in direction D (0: host to device, 1: device to host):
             fresh random source bytes, one list copied untimed; answers "ready"
  arm        poison the list's destination; answers "armed"
  go R       copy the list R times back to back; answers "done START END S1 .. SR"
             (CLOCK_MONOTONIC seconds: its first list's submission, its last list's end, and
             each list's seconds)
  check      check every byte of the destination against the list's source; answers "ok", or
             "wrong K" with K the first list position that arrived wrong
  quit       disconnect; answers "bye" and exits (the end of stdin: exits too)
Any failure answers "error CODE WHAT" (CODE a ferry status code's number) and exits 1.
FERRY_LIST_CLIENT_FAULT=I:spoil (a test tool) makes client I (1-based) spoil a byte of its
first list's destination before the check; I:exit makes it exit at its first "go" unanswered.
)";

constexpr auto kReplyTimeout = 300s;
constexpr auto kExitWait = 5s;

// One client process, its stdin (`to_`) and stdout (`from_`) on pipes. It exits at the end of
// its stdin: CloseInput, then WaitOrKill (which kills it past the deadline).
class ClientProcess {
 public:
  ClientProcess() = default;
  ClientProcess(const ClientProcess&) = delete;
  ClientProcess& operator=(const ClientProcess&) = delete;
  ~ClientProcess() {
    CloseInput();
    WaitOrKill(std::chrono::steady_clock::now() + kExitWait);
  }

  Status Start(const std::vector<std::string>& argv) {
    int in[2], out[2];
    if (::pipe2(in, O_CLOEXEC) != 0) return Internal(std::string("pipe: ") + std::strerror(errno));
    UniqueFd in_read(in[0]), in_write(in[1]);
    if (::pipe2(out, O_CLOEXEC) != 0) return Internal(std::string("pipe: ") + std::strerror(errno));
    UniqueFd out_read(out[0]), out_write(out[1]);

    std::vector<std::string> copy = argv;
    std::vector<char*> c;
    for (std::string& s : copy) c.push_back(s.data());
    c.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawnattr_t attr;
    posix_spawn_file_actions_init(&actions);
    posix_spawnattr_init(&attr);
    // This process ignores SIGPIPE while it runs clients; they get the default back.
    sigset_t default_signals;
    sigemptyset(&default_signals);
    sigaddset(&default_signals, SIGPIPE);
    int rc = posix_spawn_file_actions_adddup2(&actions, in_read.get(), 0);
    if (rc == 0) rc = posix_spawn_file_actions_adddup2(&actions, out_write.get(), 1);
    if (rc == 0) rc = posix_spawnattr_setsigdefault(&attr, &default_signals);
    if (rc == 0) rc = posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGDEF);
    // The same program as this one: /proc/self/exe is resolved by the process being started,
    // which is still this program's image until its exec.
    if (rc == 0) rc = ::posix_spawn(&pid_, "/proc/self/exe", &actions, &attr, c.data(), environ);
    posix_spawnattr_destroy(&attr);
    posix_spawn_file_actions_destroy(&actions);
    if (rc != 0) {
      pid_ = -1;
      return Internal(std::string("starting ferry-bench list-client: ") + std::strerror(rc));
    }
    to_ = std::move(in_write);
    from_ = std::move(out_read);
    return Status::Ok();
  }

  Status Send(const std::string& line) {
    const std::string with_end = line + "\n";
    size_t done = 0;
    while (done < with_end.size()) {
      const ssize_t n = ::write(to_.get(), with_end.data() + done, with_end.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        const std::string why = std::strerror(errno);
        auto last = Receive("");  // why it ended, if it said
        return last.ok() ? Unavailable("it ended (" + why + ")") : last.status();
      }
      done += static_cast<size_t>(n);
    }
    return Status::Ok();
  }

  // The next line it writes, without its end, when it begins with `want`; its error, as the
  // status it names, when it answered "error CODE WHAT"; a protocol error for anything else.
  Result<std::string> Receive(const std::string& want) {
    const auto deadline = std::chrono::steady_clock::now() + kReplyTimeout;
    for (;;) {
      if (const size_t end = pending_.find('\n'); end != std::string::npos) {
        std::string line = pending_.substr(0, end);
        pending_.erase(0, end + 1);
        if (line.rfind("error ", 0) == 0) return ErrorOf(line);
        if (line.rfind(want, 0) == 0) return line;
        return ProtocolError("answered \"" + line + "\" where \"" + want + "\" was due");
      }
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left <= 0ms) return Timeout("no answer in " + std::to_string(kReplyTimeout.count()) + " s");
      pollfd p{.fd = from_.get(), .events = POLLIN, .revents = 0};
      const int ready = ::poll(&p, 1, static_cast<int>(left.count()));
      if (ready < 0 && errno != EINTR) return Internal(std::string("poll: ") + std::strerror(errno));
      if (ready <= 0) continue;
      char buf[4096];
      const ssize_t n = ::read(from_.get(), buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return Unavailable("it ended without answering");
      pending_.append(buf, static_cast<size_t>(n));
    }
  }

  void CloseInput() { to_.reset(); }

  void WaitOrKill(std::chrono::steady_clock::time_point deadline) {
    from_.reset();
    if (pid_ <= 0) return;
    while (::waitpid(pid_, nullptr, WNOHANG) != pid_) {
      if (std::chrono::steady_clock::now() >= deadline) {
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, nullptr, 0);
        break;
      }
      std::this_thread::sleep_for(5ms);
    }
    pid_ = -1;
  }

 private:
  // "error CODE WHAT" into the status it names.
  static Status ErrorOf(const std::string& line) {
    std::istringstream in(line.substr(6));
    int code = 0;
    in >> code;
    std::string what;
    std::getline(in >> std::ws, what);
    if (!in && what.empty()) return ProtocolError("answered \"" + line + "\"");
    if (code <= 0 || code > static_cast<int>(Code::kAborted)) code = static_cast<int>(Code::kInternal);
    return Status(static_cast<Code>(code), "it said: " + what);
  }

  pid_t pid_ = -1;
  UniqueFd to_, from_;
  std::string pending_;
};

// Every client process; they are told to end all at once, and waited for against one deadline.
class ClientGroup {
 public:
  explicit ClientGroup(size_t n) {
    for (size_t i = 0; i < n; ++i) procs_.push_back(std::make_unique<ClientProcess>());
  }
  ~ClientGroup() {
    for (auto& p : procs_) p->CloseInput();
    const auto deadline = std::chrono::steady_clock::now() + kExitWait;
    for (auto& p : procs_) p->WaitOrKill(deadline);
  }
  ClientProcess& operator[](size_t i) { return *procs_[i]; }

 private:
  std::vector<std::unique_ptr<ClientProcess>> procs_;
};

struct Done {
  double start = 0, end = 0;
  std::vector<double> seconds;
};

// "done START END S1 .. SR" into its times.
Result<Done> ParseDone(const std::string& line, int reps) {
  std::istringstream in(line);
  std::string word;
  Done d;
  in >> word >> d.start >> d.end;
  for (double s; in >> s;) d.seconds.push_back(s);
  if (d.end < d.start || static_cast<int>(d.seconds.size()) != reps) {
    return ProtocolError("answered \"" + line + "\"");
  }
  return d;
}

Summary GbpsOf(const std::vector<double>& seconds, size_t bytes) {
  std::vector<double> gbps;
  for (double s : seconds) gbps.push_back(static_cast<double>(bytes) / s / 1e9);
  return Summarize(std::move(gbps));
}

// The blocks section's lists whose two regions fit in `max_bytes`, as that section runs them.
std::vector<BlockWorkload> ListsWithin(size_t max_bytes) {
  std::vector<BlockWorkload> lists;
  for (const BlockWorkload& w : ShuffledBlockWorkloads()) {
    if (2 * w.region_bytes() <= max_bytes) lists.push_back(w);
  }
  return lists;
}

}  // namespace

Result<std::vector<ListClientsRow>> RunListClients(const ConnectOptions& options, int clients, int reps,
                                                   size_t max_bytes, Progress* progress) {
  if (clients < 2 || clients > kMaxListClients) {
    return InvalidArgument("--clients takes 2.." + std::to_string(kMaxListClients));
  }
  const std::vector<BlockWorkload> lists = ListsWithin(max_bytes);
  // A client process that ends mid-run must be an error here, not SIGPIPE.
  struct sigaction ignore {
  }, was{};
  ignore.sa_handler = SIG_IGN;
  ::sigaction(SIGPIPE, &ignore, &was);
  struct RestoreSigpipe {
    struct sigaction was;
    ~RestoreSigpipe() { ::sigaction(SIGPIPE, &was, nullptr); }
  } restore{was};

  const size_t n_clients = static_cast<size_t>(clients);
  ClientGroup procs(n_clients);  // after `restore`: the clients are gone before SIGPIPE is back
  auto failed = [](size_t i, const Status& s) {
    return Status(s.code(), "list client " + std::to_string(i + 1) + ": " + s.message());
  };
  for (size_t i = 0; i < n_clients; ++i) {
    std::vector<std::string> argv = {"ferry-bench",     "list-client", "--index",
                                     std::to_string(i), "--lists",     std::to_string(lists.size())};
    if (!options.socket_path.empty()) argv.insert(argv.end(), {"--socket", options.socket_path});
    if (options.device >= 0) argv.insert(argv.end(), {"--device", std::to_string(options.device)});
    if (Status s = procs[i].Start(argv); !s.ok()) return failed(i, s);
  }
  // Tells `which` clients `command` (all of them before any answer is read, so that they start
  // together) and collects their answers, each beginning with `answer`.
  auto each = [&](const std::vector<size_t>& which, const std::string& command,
                  const std::string& answer) -> Result<std::vector<std::string>> {
    for (size_t i : which) {
      if (Status s = procs[i].Send(command); !s.ok()) return failed(i, s);
    }
    std::vector<std::string> lines;
    for (size_t i : which) {
      auto line = procs[i].Receive(answer);
      if (!line.ok()) return failed(i, line.status());
      lines.push_back(std::move(*line));
    }
    return lines;
  };
  // Every byte of each of `which` clients' destinations, checked once all of them are done.
  auto check = [&](const std::vector<size_t>& which) -> Status {
    auto answers = each(which, "check", "");
    if (!answers.ok()) return answers.status();
    for (size_t k = 0; k < which.size(); ++k) {
      const std::string& a = (*answers)[k];
      if (a == "ok") continue;
      if (a.rfind("wrong ", 0) == 0) {
        return failed(which[k], Internal("list position " + a.substr(6) + " of its list arrived wrong"));
      }
      return failed(which[k], ProtocolError("answered \"" + a + "\" to check"));
    }
    return Status::Ok();
  };
  std::vector<size_t> all(n_clients);
  for (size_t i = 0; i < n_clients; ++i) all[i] = i;
  // Each says hello unasked once it has its session and memory (or says why not, and ends).
  for (size_t i : all) {
    if (auto hello = procs[i].Receive("hello"); !hello.ok()) return failed(i, hello.status());
  }

  std::vector<ListClientsRow> rows;
  for (size_t wi = 0; wi < lists.size(); ++wi) {
    for (int dir = 0; dir < 2; ++dir) {
      ListClientsRow row;
      row.workload = lists[wi];
      row.direction = dir == 0 ? Direction::kHostToDevice : Direction::kDeviceToHost;
      const size_t n = row.workload.region_bytes();
      const std::string go = "go " + std::to_string(reps);
      if (auto r = each(all, "list " + std::to_string(wi) + " " + std::to_string(dir), "ready"); !r.ok()) {
        return r.status();
      }
      if (auto r = each({0}, "arm", "armed"); !r.ok()) return r.status();
      auto alone = each({0}, go, "done");
      if (!alone.ok()) return alone.status();
      auto alone_done = ParseDone(alone->front(), reps);
      if (!alone_done.ok()) return failed(0, alone_done.status());
      if (Status s = check({0}); !s.ok()) return s;
      row.alone_seconds = alone_done->seconds;

      if (auto r = each(all, "arm", "armed"); !r.ok()) return r.status();
      auto together = each(all, go, "done");
      if (!together.ok()) return together.status();
      double first_start = 1e300, last_start = 0, first_end = 1e300, last_end = 0;
      for (size_t i : all) {
        auto d = ParseDone((*together)[i], reps);
        if (!d.ok()) return failed(i, d.status());
        row.each_seconds.push_back(d->seconds);
        first_start = std::min(first_start, d->start);
        last_start = std::max(last_start, d->start);
        first_end = std::min(first_end, d->end);
        last_end = std::max(last_end, d->end);
      }
      if (Status s = check(all); !s.ok()) return s;
      const double span = last_end - first_start;
      row.together_gbps = static_cast<double>(n) * reps * clients / span / 1e9;
      row.all_copying = std::max(0.0, first_end - last_start) / span;
      rows.push_back(std::move(row));
      if (progress) {
        progress->Step("blocks from " + std::to_string(clients) + " clients " + lists[wi].name() +
                       (dir == 0 ? " h2d" : " d2h"));
      }
    }
  }
  if (auto bye = each(all, "quit", "bye"); !bye.ok()) return bye.status();
  return rows;
}

void PrintListClients(const std::vector<ListClientsRow>& rows, int clients, int reps) {
  std::printf(
      "\nblock lists from %d client processes at once (each its own session, pool buffer and device region;\n"
      "client 1 alone first, then all of them started together; GB/s, medians of %d lists a client [min, max];\n"
      "together: every client's bytes over the span from the first start to the last end)\n",
      clients, reps);
  std::printf("  %-15s %-4s %-24s %-*s %9s %7s %s\n", "list", "dir", "client 1 alone", 12 * clients,
              "each client, all at once", "together", "/alone", "all copying");
  for (const ListClientsRow& r : rows) {
    const size_t n = r.workload.region_bytes();
    const Summary a = GbpsOf(r.alone_seconds, n);
    char alone[64];
    std::snprintf(alone, sizeof alone, "%.2f [%.2f, %.2f]", a.median, a.min, a.max);
    std::string each;
    for (const std::vector<double>& seconds : r.each_seconds) {
      char one[16];
      std::snprintf(one, sizeof one, "%-12.2f", GbpsOf(seconds, n).median);
      each += one;
    }
    std::printf("  %-15s %-4s %-24s %-*s %9.2f %6.2fx %3.0f%% of the span\n", r.workload.name().c_str(),
                DirectionName(r.direction), alone, 12 * clients, each.c_str(), r.together_gbps,
                r.together_gbps / a.median, 100 * r.all_copying);
  }
  std::printf("every client's every list arrived intact\n");
}

std::string ListClientsJson(const std::vector<ListClientsRow>& rows, int clients) {
  auto summary = [](const Summary& s) {
    char buf[128];
    std::snprintf(buf, sizeof buf, "{\"median\":%.3f,\"min\":%.3f,\"max\":%.3f}", s.median, s.min, s.max);
    return std::string(buf);
  };
  std::string out = "{\"clients\":" + std::to_string(clients) + ",\"lists\":[";
  for (size_t i = 0; i < rows.size(); ++i) {
    const ListClientsRow& r = rows[i];
    char head[256];
    std::snprintf(head, sizeof head, "%s{\"list\":\"%s\",\"blocks\":%zu,\"block_bytes\":%zu,\"direction\":\"%s\",",
                  i ? "," : "", r.workload.name().c_str(), r.workload.count, r.workload.block_bytes,
                  DirectionName(r.direction));
    out += head;
    const size_t n = r.workload.region_bytes();
    out += "\"alone_gbps\":" + summary(GbpsOf(r.alone_seconds, n)) + ",\"each_gbps\":[";
    for (size_t c = 0; c < r.each_seconds.size(); ++c) {
      if (c) out += ',';
      out += summary(GbpsOf(r.each_seconds[c], n));
    }
    char tail[128];
    std::snprintf(tail, sizeof tail, "],\"together_gbps\":%.3f,\"all_copying\":%.3f}", r.together_gbps, r.all_copying);
    out += tail;
  }
  return out + "]}";
}

int RunListClient(const std::vector<std::string>& args) {
  ConnectOptions options;
  int index = -1;
  size_t list_count = ShuffledBlockWorkloads().size();
  auto usage_error = [](const std::string& what) {
    cli::Fail("ferry-bench list-client", what);
    return 64;  // EX_USAGE
  };
  cli::Args a(args);
  while (a.Next()) {
    if (a.IsHelp()) return cli::Help(kListClientUsage);
    if (a.Is("--socket")) {
      options.socket_path = a.Value();
    } else if (a.Is("--device")) {
      if (!a.IntValue(0, 63, options.device)) return usage_error("--device takes a CUDA device ordinal");
    } else if (a.Is("--index")) {
      if (!a.IntValue(0, kMaxListClients - 1, index)) {
        return usage_error("--index takes 0.." + std::to_string(kMaxListClients - 1));
      }
    } else if (a.Is("--lists")) {
      if (!a.IntValue(1, static_cast<long long>(ShuffledBlockWorkloads().size()), list_count)) {
        return usage_error("--lists takes 1.." + std::to_string(ShuffledBlockWorkloads().size()));
      }
    } else {
      return usage_error("unknown option '" + a.current() + "' (try --help)");
    }
  }
  if (index < 0) return usage_error("--index is needed (ferry-bench transfer --clients starts list clients)");
  auto error = [](const std::string& what, const Status& s) {
    std::printf("error %d %s: %s\n", static_cast<int>(s.code()), what.c_str(), s.message().c_str());
    std::fflush(stdout);
    return 1;
  };
  // FERRY_LIST_CLIENT_FAULT=I:spoil|I:exit (the usage says what each does).
  bool spoil = false, exit_at_go = false;
  if (const char* fault = std::getenv("FERRY_LIST_CLIENT_FAULT")) {
    const std::string mine = std::to_string(index + 1) + ":";
    spoil = std::string(fault) == mine + "spoil";
    exit_at_go = std::string(fault) == mine + "exit";
  }
  options.name = "ferry-bench list client " + std::to_string(index + 1);
  auto client = Client::Connect(options);
  if (!client.ok()) return error("connect", client.status());
  std::vector<BlockWorkload> workloads = ShuffledBlockWorkloads();
  workloads.resize(list_count);
  auto regions = AllocateListRegions(**client, workloads);
  if (!regions.ok()) return error("the lists' memory", regions.status());
  HostBuffer* const host = &regions->host;
  DeviceRegion* const registered = &regions->region;

  // The device side is reached through ferryd's contiguous copies alone (no CUDA here), so the
  // same client runs against either backend: the pool buffer goes up to fill or poison it, and
  // comes back down to check it, against `reference`, the list's source bytes kept here.
  auto contiguous = [&](Direction dir, size_t n) -> Status {
    auto t = (*client)->Copy(dir, *host, 0, *registered, 0, n);
    if (!t.ok()) return t.status();
    return t->Wait(60s);
  };
  std::vector<std::byte> reference;
  std::optional<BlockIndices> indices;
  BlockWorkload w;
  Direction dir = Direction::kHostToDevice;
  auto copy_list = [&]() -> Status {
    auto t = (*client)->CopyBlocks(dir, *host, 0, *registered, 0, indices->list(w.block_bytes));
    if (!t.ok()) return t.status();
    return t->Wait(60s);
  };
  auto poison = [&]() -> Status {
    const size_t n = w.region_bytes();
    std::memset(host->data(), 0xA5, n);
    if (dir == Direction::kDeviceToHost) return Status::Ok();
    if (Status s = contiguous(Direction::kHostToDevice, n); !s.ok()) return s;
    std::memcpy(host->data(), reference.data(), n);  // the list's source again
    return Status::Ok();
  };

  std::printf("hello\n");
  std::fflush(stdout);
  for (std::string line; std::getline(std::cin, line);) {
    std::istringstream in(line);
    std::string command;
    in >> command;
    if (command == "list") {
      size_t wi = 0;
      int d = 0;
      in >> wi >> d;
      if (!in || wi >= workloads.size() || (d != 0 && d != 1)) return error("list", InvalidArgument(line));
      w = workloads[wi];
      dir = d == 0 ? Direction::kHostToDevice : Direction::kDeviceToHost;
      indices = MakeBlockIndices(w.count, true, 0xc11e0000 + 64 * static_cast<uint64_t>(index) + wi);
      const size_t n = w.region_bytes();
      reference.resize(n);
      FillRandom(reference.data(), n, 0xc11e1000 + 64 * static_cast<uint64_t>(index) + 2 * wi + d);
      std::memcpy(host->data(), reference.data(), n);
      if (dir == Direction::kDeviceToHost) {
        if (Status s = contiguous(Direction::kHostToDevice, n); !s.ok()) return error("filling the device", s);
      }
      if (Status s = copy_list(); !s.ok()) return error("CopyBlocks", s);  // untimed: a warm-up
      std::printf("ready\n");
    } else if (command == "arm") {
      if (!indices) return error("arm", InvalidArgument("no list yet"));
      if (Status s = poison(); !s.ok()) return error("poisoning the destination", s);
      std::printf("armed\n");
    } else if (command == "go") {
      int reps = 0;
      in >> reps;
      if (!in || reps < 1 || reps > 1000 || !indices) return error("go", InvalidArgument(line));
      if (exit_at_go) return 1;
      std::vector<double> seconds;
      const double start = NowSeconds();
      for (int rep = 0; rep < reps; ++rep) {
        const double t0 = NowSeconds();
        if (Status s = copy_list(); !s.ok()) return error("CopyBlocks", s);
        seconds.push_back(NowSeconds() - t0);
      }
      std::printf("done %.9f %.9f", start, NowSeconds());
      for (double s : seconds) std::printf(" %.9f", s);
      std::printf("\n");
    } else if (command == "check") {
      if (!indices) return error("check", InvalidArgument("no list yet"));
      const size_t n = w.region_bytes();
      if (dir == Direction::kHostToDevice) {
        if (Status s = contiguous(Direction::kDeviceToHost, n); !s.ok()) return error("reading the device back", s);
      }
      if (spoil) {
        const size_t at = indices->dst[0] * w.block_bytes;
        host->data()[at] = ~host->data()[at];
        spoil = false;
      }
      const std::optional<size_t> wrong = FirstWrongBlock(*indices, w.block_bytes, reference.data(), host->data());
      if (dir == Direction::kHostToDevice) std::memcpy(host->data(), reference.data(), n);  // the source again
      if (wrong) {
        std::printf("wrong %zu\n", *wrong);
      } else {
        std::printf("ok\n");
      }
    } else if (command == "quit") {
      std::printf("bye\n");
      std::fflush(stdout);
      return 0;
    } else {
      return error("command", InvalidArgument("unknown: " + line));
    }
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace ferry::bench
