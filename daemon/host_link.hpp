// A test tool: the host backend's simulated link (config host.copy_rate) and a slowdown of the
// copies of one policy setting on it (config host.slow). With a rate, each copy piece takes
// bytes / rate seconds on its stream or lane (memcpy, then a sleep to that deadline), so copy
// times are known and dominate the host's noise; a copy planned under a policy whose settings
// match host.slow.when takes host.slow.factor times as long. Tests of `ferryctl tune` use it
// to give one setting a known cost. Never set on a production ferryd: it only slows copies.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "ferry/status.hpp"
#include "policy/policy.hpp"

namespace ferry::daemon {

struct HostLink {
  uint64_t bytes_per_second = 0;  // 0: no simulated link, copies run at memcpy speed
  // Settings as `ferryctl policy show` prints them ("streams.bulk_priority", "greatest"); a
  // policy matches when it has every one.
  std::vector<std::pair<std::string, std::string>> slow_when;
  double slow_factor = 1;

  bool paced() const { return bytes_per_second > 0; }
  // How much longer than the link's time a copy planned under `policy` takes (1: not slowed).
  double FactorFor(const policy::Policy* policy) const;
  // The time a piece of `bytes` takes on the link, `factor` times as long.
  std::chrono::nanoseconds Duration(uint64_t bytes, double factor) const;
};

// Whether `key` is a setting a policy has (`ferryctl policy show`'s keys, e.g. schedule.kind,
// streams.per_direction); the error lists them.
Status CheckPolicySettingKey(const std::string& key);
// Sleeps until `deadline` (absolute, on the steady clock).
void SleepUntil(std::chrono::steady_clock::time_point deadline);

}  // namespace ferry::daemon
