#include "daemon/snapshots.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <sstream>

#include "common/environment.hpp"
#include "common/fd.hpp"
#include "common/json.hpp"
#include "common/log.hpp"
#include "common/signed_records.hpp"
#include "common/status_macros.hpp"
#include "common/time_format.hpp"
#include "common/yaml_util.hpp"

namespace ferry::daemon {
namespace {

std::string IsoTime(std::chrono::system_clock::time_point t) { return IsoTimeUtc(t, IsoPrecision::kMilliseconds); }

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

constexpr size_t kMaxRecordBytes = 1 << 20;

std::string RecordPath(const std::string& dir, uint64_t seq) { return dir + "/" + signing::SnapshotName(seq); }

// Checks record `seq` as ferryctl verify would, with ferryd's own key: its signature, the record
// id and sequence it was signed with, and that it is a complete record of this key. Returns its
// "prev_sha256" and "chain".
Result<std::pair<std::string, std::string>> VerifyOwnRecord(const signing::PublicKey& pk, const signing::SignedFile& f,
                                                             uint64_t seq) {
  FERRY_ASSIGN_OR_RETURN(signing::SignedIdentity who, signing::VerifyRecord(pk, f.record, f.minisig));
  if (who.is_report || who.seq != seq) {
    return InvalidArgument("signed as " + (who.is_report ? "a report" : "sequence " + std::to_string(who.seq)) +
                           ", not as sequence " + std::to_string(seq));
  }
  auto root = yamlutil::LoadString(f.record, signing::SnapshotName(seq));
  if (!root.ok()) return root.status();
  try {
    const YAML::Node& r = *root;
    if (r["seq"].as<uint64_t>() != seq) return InvalidArgument("its sequence differs from its name's");
    if (r["key_id"].as<std::string>() != signing::KeyIdHex(pk.id)) return InvalidArgument("it names another key");
    return std::make_pair(r["prev_sha256"].as<std::string>(), r["chain"] ? r["chain"].as<std::string>() : std::string());
  } catch (const YAML::Exception& e) {
    return InvalidArgument(std::string("not a complete snapshot record: ") + e.what());
  }
}

}  // namespace

Result<std::unique_ptr<SnapshotWriter>> SnapshotWriter::Create(const SnapshotOptions& options) {
  std::unique_ptr<SnapshotWriter> w(new SnapshotWriter());
  w->opt_ = options;
  w->host_id_ = environment::HostId(w->opt_.host_id).front().second;
  FERRY_RETURN_IF_ERROR(signing::LoadSecretKey(options.key_path, w->key_).WithContext("snapshots.key"));
  if (::mkdir(options.dir.c_str(), 0755) != 0 && errno != EEXIST) return ErrnoStatus("mkdir " + options.dir, errno);
  FERRY_RETURN_IF_ERROR(w->Continue());
  w->window_start_ = std::chrono::system_clock::now();
  return w;
}

Status SnapshotWriter::VerifyTail(uint64_t seq, std::string* body) {
  const signing::PublicKey pk = signing::PublicKeyOf(key_);
  FERRY_ASSIGN_OR_RETURN(signing::SignedFile last, signing::ReadSignedFile(RecordPath(opt_.dir, seq), kMaxRecordBytes, false));
  FERRY_ASSIGN_OR_RETURN(auto tail, VerifyOwnRecord(pk, last, seq));
  *body = std::move(last.record);
  chain_ = tail.second.empty() ? "continued-" + signing::RecordId(*body) : tail.second;
  if (tail.first == std::string(64, '0') || seq <= 1) return Status::Ok();  // the head of its chain
  // The link back, where the record before is still there (old ones may have been pruned).
  const std::string prev_path = RecordPath(opt_.dir, seq - 1);
  struct stat st{};
  if (::lstat(prev_path.c_str(), &st) != 0 && errno == ENOENT) return Status::Ok();
  const std::string before = signing::SnapshotName(seq - 1) + ", the record before it";
  auto prev_file = signing::ReadSignedFile(prev_path, kMaxRecordBytes, false);
  if (!prev_file.ok()) return prev_file.status().WithContext(before);
  auto prev = VerifyOwnRecord(pk, *prev_file, seq - 1);
  if (!prev.ok()) return prev.status().WithContext(before);
  if (signing::Sha256Hex(prev_file->record) != tail.first) {
    return InvalidArgument("its previous-record hash is not " + signing::SnapshotName(seq - 1) + "'s");
  }
  return Status::Ok();
}

// The chain continues where the last ferryd left it, if its newest record verifies; never from
// a record that does not (a planted or damaged file): then a new chain starts above it.
Status SnapshotWriter::Continue() {
  prev_hash_ = std::string(64, '0');
  FERRY_ASSIGN_OR_RETURN(signing::SnapshotListing listing, signing::ListSnapshots(opt_.dir));
  const auto& seqs = listing.snapshots;
  if (seqs.empty()) {
    seq_ = opt_.first_sequence - 1;
    chain_ = signing::RecordId(host_id_ + " " + IsoTime(std::chrono::system_clock::now()) + " " +
                               std::to_string(::getpid()));
    return Status::Ok();
  }
  const uint64_t best = seqs.back().first;
  if (best >= (uint64_t{1} << 62)) {
    return InvalidArgument(opt_.dir + "/" + signing::SnapshotName(best) + ": a sequence this high is not ferryd's; move it away");
  }
  seq_ = best;
  std::string body;
  if (Status st = VerifyTail(best, &body); !st.ok()) {
    chain_broken_ = signing::SnapshotName(best) + " does not verify with ferryd's own key: " + st.message();
    chain_ = signing::RecordId(host_id_ + " " + chain_broken_ + " " + IsoTime(std::chrono::system_clock::now()));
    FERRY_LOG(kWarning) << "snapshots: not continuing the chain in " << opt_.dir << ": " << chain_broken_
                        << "; starting a new chain " << chain_ << " at sequence " << best + 1
                        << " (its first record says why; the files there are left as they are)";
    return Status::Ok();
  }
  prev_hash_ = signing::Sha256Hex(body);
  FERRY_LOG(kInfo) << "snapshots: continuing the chain in " << opt_.dir << " after sequence " << best
                   << " (verified with ferryd's key)";
  return Status::Ok();
}

void SnapshotWriter::Start() {
  thread_ = std::thread([this] {
    if (opt_.cublas_version) {
      std::string cublas = opt_.cublas_version();
      std::lock_guard<std::mutex> l(mu_);
      opt_.device.cublas = std::move(cublas);
    }
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

void SnapshotWriter::Samples::Add(double v, std::minstd_rand& rng) {
  sum += v;
  const uint64_t n = ++seen;
  if (kept.size() < kMaxSamples) {
    kept.push_back(static_cast<float>(v));
  } else if (const uint64_t slot = rng() % n; slot < kMaxSamples) {
    kept[slot] = static_cast<float>(v);
  }
}

void SnapshotWriter::OnCopyDone(const CopyRecord& r) {
  std::lock_guard<std::mutex> l(mu_);
  window_.copies++;
  if (!r.ok) window_.failed++;
  if (r.ok) window_.bytes[r.direction == Direction::kHostToDevice ? 0 : 1] += r.bytes;
  window_.copy.Add(r.seconds, rng_);
  window_.queued.Add(r.queued_seconds, rng_);
}

void SnapshotWriter::OnExposed(const ExposedRecord& r) {
  std::lock_guard<std::mutex> l(mu_);
  window_.exposed.Add(r.seconds, rng_);
  window_.reported_copy_seconds += r.copy_seconds;
}

void SnapshotWriter::OnRejected(std::string_view reason) {
  if (reason != RejectReasonName(RejectReason::kWaitReport)) return;
  std::lock_guard<std::mutex> l(mu_);
  window_.reports_refused++;
}

std::string SnapshotWriter::chain() const {
  std::lock_guard<std::mutex> l(mu_);
  return chain_;
}

void SnapshotWriter::OnPolicy(const Policy& now) {
  std::lock_guard<std::mutex> l(mu_);
  policy_name_ = now.name;
  policy_hash_ = now.Hash();
}

Status SnapshotWriter::WriteNow() {
  // The key is checked before each signature: a key others can read may be someone else's by
  // now, and what it signs proves nothing. The window is kept for the next try.
  if (Status key = signing::CheckSecretKeyFile(opt_.key_path); !key.ok()) {
    if (opt_.on_failure) opt_.on_failure("key_permissions");
    return PermissionDenied("not signing snapshots: " + key.message());
  }
  std::unique_lock<std::mutex> l(mu_);
  Window w = std::move(window_);
  window_ = Window{};
  const auto start = window_start_;
  const auto end = std::chrono::system_clock::now();
  window_start_ = end;
  const uint64_t seq = seq_ + 1;
  const std::string prev = prev_hash_, policy_name = policy_name_, policy_hash = policy_hash_, chain = chain_,
                    broken = chain_broken_;
  l.unlock();

  const double secs = std::max(1e-9, std::chrono::duration<double>(end - start).count());
  environment::Facts env;
  env.chip = opt_.device.name;
  env.gpu_uuid = opt_.device.uuid;
  env.cuda_driver = opt_.device.cuda_driver;
  env.cuda_runtime = opt_.device.cuda_runtime;
  if (opt_.device.backend == "cuda") {
    env.cublas = opt_.device.cublas;
  } else {
    env.no_gpu = "the host backend: copies in host memory, no GPU (" + opt_.device.uuid + " is simulated)";
  }
  env.host_id = opt_.host_id;
  std::ostringstream j;
  j << "{\n"
    << "  \"format\": \"ferry-snapshot/3\",\n"
    << "  \"seq\": " << seq << ",\n"
    << "  \"chain\": " << json::String(chain) << ",\n";
  if (!broken.empty()) j << "  \"previous_chain_broken\": " << json::String(broken) << ",\n";
  j << "  \"issued_at\": " << json::String(IsoTime(end)) << ",\n"
    << "  \"window\": {\"start\": " << json::String(IsoTime(start)) << ", \"end\": " << json::String(IsoTime(end))
    << ", \"seconds\": " << Num(secs) << "},\n"
    << "  \"environment\": " << environment::ToJson(environment::Build(env)) << ",\n"
    << "  \"ferry_version\": " << json::String(opt_.version) << ",\n"
    << "  \"key_id\": " << json::String(signing::KeyIdHex(key_.id)) << ",\n"
    << "  \"policy\": {\"name\": " << json::String(policy_name) << ", \"hash\": " << json::String(policy_hash) << "},\n"
    << "  \"measured_by_ferryd\": {\"copies\": " << w.copies << ", \"copies_failed\": " << w.failed
    << ", \"bytes_h2d\": " << w.bytes[0] << ", \"bytes_d2h\": " << w.bytes[1]
    << ", \"bandwidth_h2d_bytes_per_second\": " << Num(static_cast<double>(w.bytes[0]) / secs)
    << ", \"bandwidth_d2h_bytes_per_second\": " << Num(static_cast<double>(w.bytes[1]) / secs)
    << ", \"copy_p50_seconds\": " << Num(Percentile(w.copy.kept, 0.50))
    << ", \"copy_p99_seconds\": " << Num(Percentile(w.copy.kept, 0.99))
    << ", \"queued_p50_seconds\": " << Num(Percentile(w.queued.kept, 0.50))
    << ", \"queued_p99_seconds\": " << Num(Percentile(w.queued.kept, 0.99)) << "},\n"
    << "  \"reported_by_clients\": {\"exposed_reports_accepted\": " << w.exposed.seen
    << ", \"exposed_reports_refused\": " << w.reports_refused
    << ", \"exposed_p50_seconds\": " << Num(Percentile(w.exposed.kept, 0.50))
    << ", \"exposed_p99_seconds\": " << Num(Percentile(w.exposed.kept, 0.99))
    << ", \"exposed_seconds_sum\": " << Num(w.exposed.sum)
    << ", \"reported_copies_seconds_sum_measured_by_ferryd\": " << Num(w.reported_copy_seconds) << "},\n"
    << "  \"prev_sha256\": " << json::String(prev) << "\n"
    << "}\n";
  const std::string record = j.str();
  const std::string id = signing::RecordId(record);
  const std::string path = RecordPath(opt_.dir, seq);
  Status written = [&]() -> Status {
    FERRY_ASSIGN_OR_RETURN(std::string sig, signing::Sign(key_, record, signing::SnapshotTrustedComment(id, seq),
                                                          "ferry snapshot " + std::to_string(seq) + " from " + host_id_));
    // Signature first: a record is never on disk without its signature next to it.
    FERRY_RETURN_IF_ERROR(WriteFileAtomically(path + ".minisig", sig));
    return WriteFileAtomically(path, record);
  }();
  if (!written.ok()) {
    // The window goes back, merged with what came in since, so the next try includes it.
    l.lock();
    auto merge = [](Samples& into, Samples& from) {
      into.seen += from.seen;
      into.sum += from.sum;
      for (float v : from.kept) {
        if (into.kept.size() >= kMaxSamples) break;
        into.kept.push_back(v);
      }
    };
    window_.copies += w.copies;
    window_.failed += w.failed;
    window_.bytes[0] += w.bytes[0];
    window_.bytes[1] += w.bytes[1];
    merge(window_.copy, w.copy);
    merge(window_.queued, w.queued);
    merge(window_.exposed, w.exposed);
    window_.reported_copy_seconds += w.reported_copy_seconds;
    window_.reports_refused += w.reports_refused;
    window_start_ = start;
    l.unlock();
    if (opt_.on_failure) opt_.on_failure("write");
    return written;
  }
  l.lock();
  seq_ = seq;
  prev_hash_ = signing::Sha256Hex(record);
  chain_broken_.clear();
  l.unlock();
  if (opt_.on_written) opt_.on_written(seq, id, chain);
  FERRY_LOG(kDebug) << "snapshot " << seq << " " << id << " written";
  return Status::Ok();
}

}  // namespace ferry::daemon
