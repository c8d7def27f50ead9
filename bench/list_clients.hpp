// Block lists from several client processes at once (ferry-bench transfer --clients N): how
// ferryd shares its copy engines among clients that submit lists at the same moment, as the
// inference servers of one node do. Each client is a process of its own (`ferry-bench
// list-client`, started here) with its own session, pool buffer and device region, and uses
// nothing but libferry, so the same run works against ferryd's cuda and host backends.
//
// Per list and direction: client 1 alone first, then every client at once, their starts lined
// up (each prepares and poisons its destination, then all are told to go together). Every
// client checks every byte of its own list, once every client's timed lists are done.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "bench/bench_util.hpp"
#include "bench/block_lists.hpp"
#include "ferry/client.hpp"

namespace ferry::bench {

// Each client is a session of ferryd's, beside the bench's own: ferryd's limits.sessions_per_uid
// (16 by default) must hold them all.
inline constexpr int kMaxListClients = 8;

struct ListClientsRow {
  BlockWorkload workload;
  Direction direction = Direction::kHostToDevice;
  std::vector<double> alone_seconds;              // client 1 alone: each list's seconds
  std::vector<std::vector<double>> each_seconds;  // each client's lists' seconds while all ran
  double together_gbps = 0;   // every client's bytes over the span from the first start to the last end
  double all_copying = 0;     // the share of that span in which every client was copying
};

// Runs every shuffled list whose two regions fit in `max_bytes` (as the blocks section does)
// both ways from `clients` processes (2..kMaxListClients), `reps` timed lists each. Fails,
// naming the client and what it said, when a client cannot connect, allocate or copy, ends, or
// a list arrives wrong. `progress` (may be null) steps once per list and direction.
Result<std::vector<ListClientsRow>> RunListClients(const ConnectOptions& options, int clients, int reps,
                                                   size_t max_bytes, Progress* progress);

// The rows as a table on stdout, and as a JSON value.
void PrintListClients(const std::vector<ListClientsRow>& rows, int clients, int reps);
std::string ListClientsJson(const std::vector<ListClientsRow>& rows, int clients);

// `ferry-bench list-client`: one of those clients, told what to do on stdin, answering on stdout.
int RunListClient(const std::vector<std::string>& args);

}  // namespace ferry::bench
