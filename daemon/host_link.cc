#include "daemon/host_link.hpp"

#include <time.h>

#include <cerrno>
#include <map>
#include <set>

namespace ferry::daemon {

double HostLink::FactorFor(const policy::Policy* policy) const {
  if (slow_when.empty() || policy == nullptr) return 1;
  const auto kv = policy::CanonicalSettings(*policy);
  for (const auto& [key, value] : slow_when) {
    auto it = kv.find(key);
    if (it == kv.end() || it->second != value) return 1;
  }
  return slow_factor;
}

std::chrono::nanoseconds HostLink::Duration(uint64_t bytes, double factor) const {
  if (!paced()) return std::chrono::nanoseconds(0);
  return std::chrono::nanoseconds(
      static_cast<int64_t>(static_cast<double>(bytes) * 1e9 * factor / static_cast<double>(bytes_per_second)));
}

Status CheckPolicySettingKey(const std::string& key) {
  // Every key some policy prints: the defaults' (chunked) and a geometric schedule's own.
  policy::Policy chunked, geometric;
  geometric.schedule = policy::Schedule::kGeometric;
  std::set<std::string> keys;
  for (const policy::Policy* p : {&chunked, &geometric}) {
    for (const auto& [k, v] : policy::CanonicalSettings(*p)) {
      if (k != "name" && k.rfind("classes.", 0) != 0) keys.insert(k);
    }
  }
  if (keys.count(key)) return Status::Ok();
  std::string known;
  for (const std::string& k : keys) known += (known.empty() ? "" : ", ") + k;
  return InvalidArgument("'" + key + "' is not a policy setting (one of: " + known + ")");
}

void SleepUntil(std::chrono::steady_clock::time_point deadline) {
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(deadline.time_since_epoch()).count();
  const timespec ts{static_cast<time_t>(ns / 1'000'000'000), static_cast<long>(ns % 1'000'000'000)};
  while (::clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, nullptr) == EINTR) {
  }
}

}  // namespace ferry::daemon
