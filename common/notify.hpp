// systemd's notify protocol (sd_notify(3)), spoken directly: one datagram to $NOTIFY_SOCKET.
// No-ops when ferryd does not run under systemd.
#pragma once

#include <cstdint>
#include <string_view>

namespace ferry {

void SdNotify(std::string_view state);
// The watchdog interval systemd asked for ($WATCHDOG_USEC for this pid), or 0.
uint64_t WatchdogIntervalNanos();

}  // namespace ferry
