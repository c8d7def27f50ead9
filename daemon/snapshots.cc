#include "daemon/snapshots.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <sstream>

#include "common/fd.hpp"
#include "common/log.hpp"

namespace ferry::daemon {
namespace {

std::string IsoTime(std::chrono::system_clock::time_point t) {
  const std::time_t s = std::chrono::system_clock::to_time_t(t);
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(t.time_since_epoch()).count() % 1000;
  std::tm tm{};
  gmtime_r(&s, &tm);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday,
                tm.tm_hour, tm.tm_min, tm.tm_sec, static_cast<int>(ms));
  return buf;
}

std::string Json(std::string_view s) {  // a JSON string literal
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char b[8];
      std::snprintf(b, sizeof b, "\\u%04x", c);
      out += b;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

std::string Num(double v) {
  char b[40];
  std::snprintf(b, sizeof b, "%.9g", v);
  return b;
}

double Percentile(std::vector<float>& v, double q) {
  if (v.empty()) return 0;
  const size_t k = std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())));
  std::nth_element(v.begin(), v.begin() + static_cast<long>(k), v.end());
  return v[k];
}

Status WriteAtomically(const std::string& path, std::string_view data) {
  const std::string tmp = path + ".tmp";
  UniqueFd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0644));
  if (!fd.valid()) return ErrnoStatus("create " + tmp, errno);
  if (::write(fd.get(), data.data(), data.size()) != static_cast<ssize_t>(data.size())) return ErrnoStatus("write " + tmp, errno);
  if (::fsync(fd.get()) != 0) return ErrnoStatus("fsync " + tmp, errno);
  if (::rename(tmp.c_str(), path.c_str()) != 0) return ErrnoStatus("rename " + tmp, errno);
  return Status::Ok();
}

std::string SnapshotName(uint64_t seq) {
  char b[40];
  std::snprintf(b, sizeof b, "snapshot-%06" PRIu64 ".json", seq);
  return b;
}

}  // namespace

Result<std::unique_ptr<SnapshotWriter>> SnapshotWriter::Create(const SnapshotOptions& options) {
  std::unique_ptr<SnapshotWriter> w(new SnapshotWriter());
  w->opt_ = options;
  if (w->opt_.host_id.empty()) {
    std::ifstream f("/etc/machine-id");
    std::getline(f, w->opt_.host_id);
    if (w->opt_.host_id.empty()) w->opt_.host_id = "unknown";
  }
  FERRY_RETURN_IF_ERROR(signing::LoadSecretKey(options.key_path, w->key_).WithContext("snapshots.key"));
  if (::mkdir(options.dir.c_str(), 0755) != 0 && errno != EEXIST) return ErrnoStatus("mkdir " + options.dir, errno);
  FERRY_RETURN_IF_ERROR(w->Continue());
  w->window_start_ = std::chrono::system_clock::now();
  return w;
}

// The chain continues where the last ferryd left it: the highest sequence in dir.
Status SnapshotWriter::Continue() {
  prev_hash_ = std::string(64, '0');
  DIR* d = ::opendir(opt_.dir.c_str());
  if (d == nullptr) return ErrnoStatus("opendir " + opt_.dir, errno);
  uint64_t best = 0;
  while (dirent* e = ::readdir(d)) {
    unsigned long long n = 0;
    char tail[8] = {0};
    if (std::sscanf(e->d_name, "snapshot-%llu.%5s", &n, tail) == 2 && std::string(tail) == "json" &&
        std::string(e->d_name).size() == SnapshotName(n).size()) {
      best = std::max<uint64_t>(best, n);
    }
  }
  ::closedir(d);
  if (best == 0) return Status::Ok();
  std::ifstream f(opt_.dir + "/" + SnapshotName(best), std::ios::binary);
  std::string body((std::istreambuf_iterator<char>(f)), {});
  seq_ = best;
  prev_hash_ = signing::Sha256Hex(body);
  FERRY_LOG(kInfo) << "snapshots: continuing the chain in " << opt_.dir << " after sequence " << best;
  return Status::Ok();
}

void SnapshotWriter::Start() {
  thread_ = std::thread([this] {
    std::unique_lock<std::mutex> l(mu_);
    while (!stop_) {
      if (cv_.wait_for(l, opt_.interval, [this] { return stop_; })) break;
      l.unlock();
      Status st = WriteNow();
      if (!st.ok()) {
        FERRY_LOG(kError) << "snapshot not written: " << st.ToString();
      }
      l.lock();
    }
  });
}

SnapshotWriter::~SnapshotWriter() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) {
    thread_.join();
    Status st = WriteNow();  // the last window, however short
    if (!st.ok()) {
      FERRY_LOG(kError) << "last snapshot not written: " << st.ToString();
    }
  }
}

uint64_t SnapshotWriter::last_sequence() const {
  std::lock_guard<std::mutex> l(mu_);
  return seq_;
}

void SnapshotWriter::OnCopyDone(const CopyRecord& r) {
  std::lock_guard<std::mutex> l(mu_);
  window_.copies++;
  if (!r.ok) window_.failed++;
  if (r.ok) window_.bytes[r.direction == Direction::kHostToDevice ? 0 : 1] += r.bytes;
}

void SnapshotWriter::OnExposed(Direction, std::string_view, std::string_view, double seconds) {
  std::lock_guard<std::mutex> l(mu_);
  // Past the cap, keep a uniform sample (reservoir), so percentiles stay honest under load.
  const uint64_t n = ++window_.exposed_seen;
  if (window_.exposed.size() < kMaxSamples) {
    window_.exposed.push_back(static_cast<float>(seconds));
  } else if (const uint64_t slot = rng_() % n; slot < kMaxSamples) {
    window_.exposed[slot] = static_cast<float>(seconds);
  }
}

void SnapshotWriter::OnPolicy(const Policy& now) {
  std::lock_guard<std::mutex> l(mu_);
  policy_name_ = now.name;
  policy_hash_ = now.Hash();
}

Status SnapshotWriter::WriteNow() {
  std::unique_lock<std::mutex> l(mu_);
  Window w = std::move(window_);
  window_ = Window{};
  const auto start = window_start_;
  const auto end = std::chrono::system_clock::now();
  window_start_ = end;
  const uint64_t seq = seq_ + 1;
  const std::string prev = prev_hash_, policy_name = policy_name_, policy_hash = policy_hash_;
  l.unlock();

  const double secs = std::max(1e-9, std::chrono::duration<double>(end - start).count());
  const double p50 = Percentile(w.exposed, 0.50), p99 = Percentile(w.exposed, 0.99);
  std::ostringstream j;
  j << "{\n"
    << "  \"format\": \"ferry-snapshot/1\",\n"
    << "  \"seq\": " << seq << ",\n"
    << "  \"issued_at\": " << Json(IsoTime(end)) << ",\n"
    << "  \"window\": {\"start\": " << Json(IsoTime(start)) << ", \"end\": " << Json(IsoTime(end))
    << ", \"seconds\": " << Num(secs) << "},\n"
    << "  \"host_id\": " << Json(opt_.host_id) << ",\n"
    << "  \"gpu\": {\"name\": " << Json(opt_.gpu_name) << ", \"uuid\": " << Json(opt_.gpu_uuid)
    << ", \"driver\": " << Json(opt_.driver) << ", \"cuda_runtime\": " << Json(opt_.cuda_runtime)
    << ", \"cublas\": " << Json(opt_.cublas) << "},\n"
    << "  \"ferry_version\": " << Json(opt_.version) << ",\n"
    << "  \"key_id\": " << Json(signing::KeyIdHex(key_.id)) << ",\n"
    << "  \"policy\": {\"name\": " << Json(policy_name) << ", \"hash\": " << Json(policy_hash) << "},\n"
    << "  \"metrics\": {\"copies\": " << w.copies << ", \"copies_failed\": " << w.failed
    << ", \"bytes_h2d\": " << w.bytes[0] << ", \"bytes_d2h\": " << w.bytes[1]
    << ", \"bandwidth_h2d_bytes_per_second\": " << Num(static_cast<double>(w.bytes[0]) / secs)
    << ", \"bandwidth_d2h_bytes_per_second\": " << Num(static_cast<double>(w.bytes[1]) / secs)
    << ", \"exposed_waits\": " << w.exposed_seen << ", \"exposed_p50_seconds\": " << Num(p50)
    << ", \"exposed_p99_seconds\": " << Num(p99) << "},\n"
    << "  \"prev_sha256\": " << Json(prev) << "\n"
    << "}\n";
  const std::string record = j.str();
  const std::string id = signing::RecordId(record);
  FERRY_ASSIGN_OR_RETURN(std::string sig, signing::Sign(key_, record, "ferry snapshot " + id + " seq " + std::to_string(seq),
                                                        "ferry snapshot " + std::to_string(seq) + " from " + opt_.host_id));
  const std::string path = opt_.dir + "/" + SnapshotName(seq);
  // Signature first: a record is never on disk without its signature next to it.
  FERRY_RETURN_IF_ERROR(WriteAtomically(path + ".minisig", sig));
  FERRY_RETURN_IF_ERROR(WriteAtomically(path, record));
  l.lock();
  seq_ = seq;
  prev_hash_ = signing::Sha256Hex(record);
  FERRY_LOG(kDebug) << "snapshot " << seq << " " << id << " written";
  return Status::Ok();
}

}  // namespace ferry::daemon
