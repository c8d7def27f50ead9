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
#include <cstring>
#include <iostream>
#include <optional>
#include <sstream>
#include <thread>

#include "common/cli.hpp"

extern char** environ;

namespace ferry::bench {
namespace {

using namespace std::chrono_literals;

constexpr const char* kListClientUsage = R"(usage: ferry-bench list-client --socket PATH --index I [--device N]

One client of `ferry-bench transfer --clients N`, which starts it: it connects to ferryd, takes a
pool buffer and a device region as large as the largest list, says "hello" on stdout, and then
reads commands on stdin, one a line, answering each on stdout:
  list W D   set up list W of the blocks section (0: 4096 x 16 KiB, 1: 2048 x 64 KiB,
             2: 512 x 256 KiB) in direction D (0: host to device, 1: device to host): fresh
             random source bytes, one list copied untimed; answers "ready"
  arm        poison the list's destination; answers "armed"
  go R       copy the list R times back to back, then check every byte of the destination;
             answers "done START END CHECK S1 .. SR" (CLOCK_MONOTONIC seconds; CHECK "ok" or
             "wrong:K", K the first list position that arrived wrong; Si each list's seconds)
  quit       (or the end of stdin) disconnect and exit
Any failure answers "error WHAT" and exits 1.
)";

constexpr auto kReplyTimeout = 300s;

// One client process, its stdin (`to`) and stdout (`from`) on pipes. Closing `to` ends it.
class ClientProcess {
 public:
  ClientProcess() = default;
  ClientProcess(const ClientProcess&) = delete;
  ClientProcess& operator=(const ClientProcess&) = delete;
  ~ClientProcess() { Stop(); }

  Status Start(const std::vector<std::string>& argv) {
    int in[2], out[2];
    if (::pipe2(in, O_CLOEXEC) != 0) return Internal(std::string("pipe: ") + std::strerror(errno));
    if (::pipe2(out, O_CLOEXEC) != 0) {
      ::close(in[0]);
      ::close(in[1]);
      return Internal(std::string("pipe: ") + std::strerror(errno));
    }
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, in[0], 0);
    posix_spawn_file_actions_adddup2(&actions, out[1], 1);
    std::vector<std::string> copy = argv;
    std::vector<char*> c;
    for (std::string& s : copy) c.push_back(s.data());
    c.push_back(nullptr);
    // The same program as this one: /proc/self/exe is resolved by the process being started,
    // which is still this program's image until its exec.
    const int rc = ::posix_spawn(&pid_, "/proc/self/exe", &actions, nullptr, c.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    ::close(in[0]);
    ::close(out[1]);
    to_ = in[1];
    from_ = out[0];
    if (rc != 0) {
      pid_ = -1;
      return Internal(std::string("starting ferry-bench list-client: ") + std::strerror(rc));
    }
    return Status::Ok();
  }

  Status Send(const std::string& line) {
    const std::string with_end = line + "\n";
    size_t done = 0;
    while (done < with_end.size()) {
      const ssize_t n = ::write(to_, with_end.data() + done, with_end.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        const std::string why = std::strerror(errno);
        auto last = Receive("");  // what it said before it ended, if anything
        return Unavailable("the client process is gone (" + why + ")" +
                           (last.ok() && !last->empty() ? ": it said \"" + *last + "\"" : ""));
      }
      done += static_cast<size_t>(n);
    }
    return Status::Ok();
  }

  // The next line it writes, without its end; an error naming what it said instead of `want`.
  Result<std::string> Receive(const std::string& want) {
    const auto deadline = std::chrono::steady_clock::now() + kReplyTimeout;
    for (;;) {
      if (const size_t end = pending_.find('\n'); end != std::string::npos) {
        std::string line = pending_.substr(0, end);
        pending_.erase(0, end + 1);
        if (line.rfind(want, 0) == 0) return line;
        return Internal("answered \"" + line + "\" where \"" + want + "\" was due");
      }
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left <= 0ms) return Timeout("no answer in " + std::to_string(kReplyTimeout.count()) + " s");
      pollfd p{.fd = from_, .events = POLLIN, .revents = 0};
      const int ready = ::poll(&p, 1, static_cast<int>(left.count()));
      if (ready < 0 && errno != EINTR) return Internal(std::string("poll: ") + std::strerror(errno));
      if (ready <= 0) continue;
      char buf[4096];
      const ssize_t n = ::read(from_, buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return Unavailable("ended without answering (see its error above)");
      pending_.append(buf, static_cast<size_t>(n));
    }
  }

 private:
  void Stop() {
    if (to_ >= 0) ::close(to_);
    if (from_ >= 0) ::close(from_);
    to_ = from_ = -1;
    if (pid_ <= 0) return;
    for (int i = 0; i < 100; ++i) {  // it exits at the end of its stdin
      if (::waitpid(pid_, nullptr, WNOHANG) == pid_) return;
      std::this_thread::sleep_for(50ms);
    }
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }

  pid_t pid_ = -1;
  int to_ = -1, from_ = -1;
  std::string pending_;
};

struct Done {
  double start = 0, end = 0;
  std::vector<double> seconds;
};

// "done START END CHECK S1 .. SR" into its times; an error when CHECK is not "ok".
Result<Done> ParseDone(const std::string& line, int reps) {
  std::istringstream in(line);
  std::string word, check;
  Done d;
  in >> word >> d.start >> d.end >> check;
  if (!in) return Internal("answered \"" + line + "\"");
  if (check != "ok") return Internal("its list arrived wrong (" + check + ": the first list position wrong)");
  for (double s; in >> s;) d.seconds.push_back(s);
  if (static_cast<int>(d.seconds.size()) != reps) return Internal("answered \"" + line + "\"");
  return d;
}

Summary GbpsOf(const std::vector<double>& seconds, size_t bytes) {
  std::vector<double> gbps;
  for (double s : seconds) gbps.push_back(static_cast<double>(bytes) / s / 1e9);
  return Summarize(std::move(gbps));
}

}  // namespace

Result<std::vector<ListClientsRow>> RunListClients(const ConnectOptions& options, int clients, int reps,
                                                   Progress* progress) {
  if (clients < 2 || clients > 16) return InvalidArgument("--clients takes 2..16");
  // A client process that dies mid-run must be an error here, not SIGPIPE.
  struct sigaction ignore {
  }, was{};
  ignore.sa_handler = SIG_IGN;
  ::sigaction(SIGPIPE, &ignore, &was);
  struct RestoreSigpipe {
    struct sigaction was;
    ~RestoreSigpipe() { ::sigaction(SIGPIPE, &was, nullptr); }
  } restore{was};

  std::vector<std::unique_ptr<ClientProcess>> procs;
  auto failed = [&](size_t i, const Status& s) {
    return Status(s.code(), "list client " + std::to_string(i + 1) + ": " + s.message());
  };
  for (int i = 0; i < clients; ++i) {
    std::vector<std::string> argv = {"ferry-bench", "list-client", "--index", std::to_string(i)};
    if (!options.socket_path.empty()) argv.insert(argv.end(), {"--socket", options.socket_path});
    if (options.device >= 0) argv.insert(argv.end(), {"--device", std::to_string(options.device)});
    procs.push_back(std::make_unique<ClientProcess>());
    if (Status s = procs.back()->Start(argv); !s.ok()) return failed(i, s);
  }
  auto each = [&](const std::vector<size_t>& which, const std::string& command,
                  const std::string& answer) -> Result<std::vector<std::string>> {
    for (size_t i : which) {
      if (Status s = procs[i]->Send(command); !s.ok()) return failed(i, s);
    }
    std::vector<std::string> lines;
    for (size_t i : which) {
      auto line = procs[i]->Receive(answer);
      if (!line.ok()) return failed(i, line.status());
      lines.push_back(std::move(*line));
    }
    return lines;
  };
  std::vector<size_t> all(static_cast<size_t>(clients));
  for (size_t i = 0; i < all.size(); ++i) all[i] = i;
  // Each says hello unasked once it has its session and memory (or says why not, and ends).
  for (size_t i : all) {
    if (auto hello = procs[i]->Receive("hello"); !hello.ok()) return failed(i, hello.status());
  }

  std::vector<ListClientsRow> rows;
  const std::vector<BlockWorkload> workloads = ShuffledBlockWorkloads();
  for (size_t wi = 0; wi < workloads.size(); ++wi) {
    for (int dir = 0; dir < 2; ++dir) {
      ListClientsRow row;
      row.workload = workloads[wi];
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
      row.alone = GbpsOf(alone_done->seconds, n);

      if (auto r = each(all, "arm", "armed"); !r.ok()) return r.status();
      auto together = each(all, go, "done");
      if (!together.ok()) return together.status();
      double first_start = 1e300, last_start = 0, first_end = 1e300, last_end = 0;
      for (size_t i = 0; i < all.size(); ++i) {
        auto d = ParseDone((*together)[i], reps);
        if (!d.ok()) return failed(i, d.status());
        row.each.push_back(GbpsOf(d->seconds, n));
        first_start = std::min(first_start, d->start);
        last_start = std::max(last_start, d->start);
        first_end = std::min(first_end, d->end);
        last_end = std::max(last_end, d->end);
      }
      const double span = last_end - first_start;
      row.together_gbps = static_cast<double>(n) * reps * clients / span / 1e9;
      row.all_copying = std::max(0.0, first_end - last_start) / span;
      rows.push_back(std::move(row));
      if (progress) {
        progress->Step("blocks from " + std::to_string(clients) + " clients " + workloads[wi].name() +
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
    char alone[64];
    std::snprintf(alone, sizeof alone, "%.2f [%.2f, %.2f]", r.alone.median, r.alone.min, r.alone.max);
    std::string each;
    for (const Summary& s : r.each) {
      char one[16];
      std::snprintf(one, sizeof one, "%-12.2f", s.median);
      each += one;
    }
    std::printf("  %-15s %-4s %-24s %-*s %9.2f %6.2fx %3.0f%% of the span\n", r.workload.name().c_str(),
                r.direction == Direction::kHostToDevice ? "h2d" : "d2h", alone, 12 * clients, each.c_str(),
                r.together_gbps, r.together_gbps / r.alone.median, 100 * r.all_copying);
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
                  r.direction == Direction::kHostToDevice ? "h2d" : "d2h");
    out += head;
    out += "\"alone_gbps\":" + summary(r.alone) + ",\"each_gbps\":[";
    for (size_t c = 0; c < r.each.size(); ++c) {
      if (c) out += ',';
      out += summary(r.each[c]);
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
      if (!a.IntValue(0, 1023, index)) return usage_error("--index takes 0..1023");
    } else {
      return usage_error("unknown option '" + a.current() + "' (try --help)");
    }
  }
  if (index < 0) return usage_error("--index is needed (ferry-bench transfer --clients starts list clients)");
  auto error = [](const std::string& what, const Status& s) {
    std::printf("error %s: %s\n", what.c_str(), s.ToString().c_str());
    std::fflush(stdout);
    return 1;
  };
  options.name = "ferry-bench list client " + std::to_string(index + 1);
  auto client = Client::Connect(options);
  if (!client.ok()) return error("connect", client.status());
  const std::vector<BlockWorkload> workloads = ShuffledBlockWorkloads();
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
  std::printf("hello\n");
  std::fflush(stdout);
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
    if (dir == Direction::kDeviceToHost) {
      std::memset(host->data(), 0xA5, n);
      return Status::Ok();
    }
    std::memset(host->data(), 0xA5, n);
    if (Status s = contiguous(Direction::kHostToDevice, n); !s.ok()) return s;
    std::memcpy(host->data(), reference.data(), n);
    return Status::Ok();
  };

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
      std::vector<double> seconds;
      const double start = NowSeconds();
      for (int rep = 0; rep < reps; ++rep) {
        const double t0 = NowSeconds();
        if (Status s = copy_list(); !s.ok()) return error("CopyBlocks", s);
        seconds.push_back(NowSeconds() - t0);
      }
      const double end = NowSeconds();
      const size_t n = w.region_bytes();
      if (dir == Direction::kHostToDevice) {
        if (Status s = contiguous(Direction::kDeviceToHost, n); !s.ok()) return error("reading the device back", s);
      }
      const std::optional<size_t> wrong = FirstWrongBlock(*indices, w.block_bytes, reference.data(), host->data());
      if (dir == Direction::kHostToDevice) std::memcpy(host->data(), reference.data(), n);
      std::printf("done %.9f %.9f %s", start, end, wrong ? ("wrong:" + std::to_string(*wrong)).c_str() : "ok");
      for (double s : seconds) std::printf(" %.9f", s);
      std::printf("\n");
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
