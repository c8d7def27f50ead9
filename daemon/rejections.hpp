// Counts ferryd's refused requests: ServerCounters::rejected, and the observer told the reason
// (a bounded set: RejectReason). Event-loop thread only.
#pragma once

#include "daemon/reject_reason.hpp"
#include "daemon/server.hpp"

namespace ferry::daemon {

class Rejections {
 public:
  Rejections(ServerCounters& counters, ServerObserver* observer) : counters_(counters), observer_(observer) {}

  void Count(RejectReason reason) {
    counters_.rejected++;
    if (observer_ != nullptr) observer_->OnRejected(RejectReasonName(reason));
  }
  void Count(const Status& refusal) { Count(RejectReasonFor(refusal)); }

 private:
  ServerCounters& counters_;
  ServerObserver* observer_;
};

}  // namespace ferry::daemon
