// Policies: the shipped files, the parser's errors, the schedules' pieces, and the scheduler
// applying them to real clients of an in-process ferryd (host backend).
#include <gtest/gtest.h>

#include <atomic>
#include <deque>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <thread>
#include <vector>

#include "policy/policy.hpp"
#include "test_util.hpp"

namespace ferry {
namespace {

using namespace std::chrono_literals;
using daemon::ParsePolicy;
using daemon::Policy;
using testing::DaemonHarness;
using testing::PausableBackend;

std::shared_ptr<const Policy> MustParse(const std::string& text) {
  auto p = ParsePolicy(text, "t.yaml");
  EXPECT_TRUE(p.ok()) << p.status().ToString();
  return p.ok() ? *p : nullptr;
}

TEST(Policy, EveryShippedPolicyParsesAndTheDefaultIsChunked) {
  for (const char* name : {"serial", "side-stream", "chunked", "chunked-8mib", "geometric", "latency-bulk"}) {
    auto p = daemon::LoadPolicyFile(std::string(FERRY_SOURCE_DIR) + "/policies/" + name + ".yaml");
    ASSERT_TRUE(p.ok()) << name << ": " << p.status().ToString();
    EXPECT_EQ((*p)->name, name);
  }
  auto chunked = daemon::LoadPolicyFile(std::string(FERRY_SOURCE_DIR) + "/policies/chunked.yaml");
  EXPECT_EQ(Policy().Hash(), (*chunked)->Hash()) << "built-in default:\n" << Policy().Canonical()
                                                 << "chunked.yaml:\n" << (*chunked)->Canonical();
}

TEST(Policy, SchedulesCutCopiesAsTheySay) {
  std::vector<uint64_t> v;
  MustParse("schedule: {kind: serial}\n")->Pieces(100 << 20, v);
  EXPECT_EQ(v, std::vector<uint64_t>{100 << 20});
  MustParse("schedule: {kind: chunked, chunk_size: 4MiB}\n")->Pieces((10 << 20) + 1, v);
  EXPECT_EQ(v, (std::vector<uint64_t>{4 << 20, 4 << 20, (2 << 20) + 1}));
  MustParse("schedule: {kind: geometric, ratio: 0.5, min_chunk: 1MiB}\n")->Pieces(64 << 20, v);
  ASSERT_GE(v.size(), 4u);
  uint64_t sum = 0;
  for (size_t i = 0; i < v.size(); ++i) {
    sum += v[i];
    if (i + 1 < v.size()) {
      EXPECT_GE(v[i], v[i + 1]) << "chunks must shrink toward the tail";
    }
  }
  EXPECT_EQ(sum, 64ull << 20);
  EXPECT_EQ(v.front(), 32ull << 20);
  EXPECT_LE(v.back(), 2ull << 20) << "the tail piece is small";
}

TEST(Policy, ToYamlWritesAFileThatParsesBackToTheSamePolicy) {
  std::vector<std::shared_ptr<const Policy>> all{std::make_shared<Policy>()};
  for (const char* name : {"serial", "side-stream", "chunked", "chunked-8mib", "geometric", "latency-bulk"}) {
    auto p = daemon::LoadPolicyFile(std::string(FERRY_SOURCE_DIR) + "/policies/" + name + ".yaml");
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    all.push_back(*p);
  }
  all.push_back(MustParse("name: 'odd \"name\"'\nschedule: {kind: geometric, ratio: 0.3, min_chunk: 256KiB, first_chunk: 8MiB}\n"
                          "classes: [{name: a, weight: 2, latency: false}, {name: b}]\n"
                          "clients: [{name: 'x*', uid: 1000, class: b}]\n"));
  for (const auto& p : all) {
    const std::string yaml = p->ToYaml();
    auto back = ParsePolicy(yaml, p->name + ".yaml");
    ASSERT_TRUE(back.ok()) << back.status().ToString() << "\n" << yaml;
    EXPECT_EQ((*back)->Canonical(), p->Canonical()) << yaml;
    EXPECT_EQ((*back)->description, p->description);
  }
}

TEST(Policy, HashCoversSettingsNotSpelling) {
  auto a = MustParse("schedule:\n  kind: chunked\n  chunk_size: 8MiB\n");
  auto b = MustParse("# same, said differently\nschedule: {kind: chunked, chunk_size: 8388608}\nname: chunked\n");
  auto c = MustParse("schedule: {kind: chunked, chunk_size: 16MiB}\n");
  EXPECT_EQ(a->Hash(), b->Hash());
  EXPECT_NE(a->Hash(), c->Hash());
  auto diff = daemon::DiffPolicies(*a, *c);
  ASSERT_EQ(diff.size(), 1u);
  EXPECT_EQ(diff[0], "schedule.chunk_size: 8MiB -> 16MiB");
}

TEST(Policy, TheJoinSizeIsReadHashedAndDiffed) {
  auto base = MustParse("name: j\n");
  auto four = MustParse("name: j\nbatching: {join: 4MiB}\n");
  auto off = MustParse("name: j\nbatching:\n  join: 0\n");
  EXPECT_EQ(base->join_bytes, 16ull << 20);
  EXPECT_EQ(four->join_bytes, 4ull << 20);
  EXPECT_EQ(off->join_bytes, 0u);
  EXPECT_NE(base->Hash(), four->Hash());
  EXPECT_EQ(daemon::DiffPolicies(*base, *four), std::vector<std::string>{"batching.join: 16MiB -> 4MiB"});
  auto back = ParsePolicy(off->ToYaml(), "off.yaml");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ((*back)->join_bytes, 0u);
}

TEST(Policy, ClientsAreClassedByNameAndUid) {
  auto p = MustParse(
      "classes: [{name: fast, weight: 3}, {name: slow, weight: 1, latency: false}]\n"
      "clients: [{name: 'serve-*', class: fast}, {uid: 1234, class: slow}]\ndefault_class: slow\n");
  EXPECT_EQ(p->ClassFor("serve-llama", 99).name, "fast");
  EXPECT_EQ(p->ClassFor("other", 1234).name, "slow");
  EXPECT_EQ(p->ClassFor("other", 1).name, "slow");
  EXPECT_FALSE(p->ClassFor("other", 1).latency_allowed);
  EXPECT_EQ(p->ClassFor("serve-x", 1).weight, 3u);
}

TEST(Policy, GpuOverridesPutTheirEngineSettingsOverTheNodesPolicy) {
  auto node = MustParse(
      "schedule: {kind: chunked, chunk_size: 32MiB}\n"
      "streams: {per_direction: 4}\n"
      "limits: {in_flight_bytes: 256MiB, latency_max_bytes: 512KiB}\n"
      "classes: [{name: a, weight: 2}]\n"
      "gpus:\n"
      "  - match: [1, GPU-ABCDEF01-0000-0000-0000-000000000000]\n"
      "    schedule: {kind: geometric, ratio: 0.25}\n"
      "    limits: {in_flight_bytes: 64MiB}\n"
      "  - match: 3\n"
      "    schedule: {kind: serial}\n");
  ASSERT_EQ(node->gpu_overrides.size(), 2u);
  const auto& by_ordinal = node->ForGpu(node, 1, "GPU-99");
  const auto& by_uuid = node->ForGpu(node, 0, "gpu-abcdef01-0000-0000-0000-000000000000");  // any case
  const auto& serial = node->ForGpu(node, 3, "");
  EXPECT_EQ(node->ForGpu(node, 0, "GPU-99"), node);
  EXPECT_EQ(node->ForGpu(node, 2, ""), node);
  EXPECT_EQ(by_ordinal, by_uuid);
  ASSERT_NE(by_ordinal, node);
  // What the override says...
  EXPECT_EQ(by_ordinal->schedule, daemon::Schedule::kGeometric);
  EXPECT_EQ(by_ordinal->ratio, 0.25);
  EXPECT_EQ(by_ordinal->in_flight_bytes, 64ull << 20);
  // ...over what the node's policy says, which it keeps otherwise.
  EXPECT_EQ(by_ordinal->bulk_streams, 4u);
  EXPECT_EQ(by_ordinal->latency_max_bytes, 512ull << 10);
  EXPECT_EQ(by_ordinal->classes.size(), 1u);
  EXPECT_EQ(by_ordinal->classes[0].weight, 2u);
  EXPECT_TRUE(by_ordinal->gpu_overrides.empty());
  EXPECT_EQ(node->schedule, daemon::Schedule::kChunked);
  EXPECT_EQ(node->in_flight_bytes, 256ull << 20);
  // A serial override takes its own streams and copies in flight, not the node's 4 streams.
  EXPECT_EQ(serial->schedule, daemon::Schedule::kSerial);
  EXPECT_EQ(serial->bulk_streams, 1u);
  EXPECT_EQ(serial->max_copies_in_flight, 1u);
  EXPECT_EQ(serial->in_flight_bytes, 256ull << 20);
}

TEST(Policy, GpuOverridesAreInTheHashTheDiffAndTheFileWritten) {
  const std::string base = "schedule: {kind: chunked, chunk_size: 32MiB}\n";
  auto plain = MustParse(base);
  auto a = MustParse(base + "gpus: [{match: [2, 0], limits: {in_flight_bytes: 64MiB}}]\n");
  auto same = MustParse(base + "gpus:\n  - match: [2, '0']\n    limits:\n      in_flight_bytes: 67108864\n");
  auto other = MustParse(base + "gpus: [{match: [2, 0], limits: {in_flight_bytes: 32MiB}}]\n");
  EXPECT_NE(a->Hash(), plain->Hash());
  EXPECT_EQ(a->Hash(), same->Hash()) << a->Canonical() << same->Canonical();
  EXPECT_NE(a->Hash(), other->Hash());
  EXPECT_NE(a->Canonical().find("gpus.000.limits.in_flight_bytes: 64MiB\ngpus.000.match: 2, 0\n"), std::string::npos)
      << a->Canonical();
  EXPECT_EQ(a->gpu_overrides[0].Changes(*a),
            (std::vector<std::string>{"limits.client_in_flight_bytes: 128MiB -> 64MiB",
                                      "limits.in_flight_bytes: 128MiB -> 64MiB"}));
  // Only what the override changes is in the canonical text, not the settings it keeps.
  EXPECT_EQ(a->Canonical().find("gpus.000.schedule"), std::string::npos) << a->Canonical();
  auto diff = daemon::DiffPolicies(*a, *other);
  // (client_in_flight_bytes follows in_flight_bytes where it is not set.)
  EXPECT_EQ(diff, (std::vector<std::string>{"gpus.000.limits.client_in_flight_bytes: 64MiB -> 32MiB",
                                            "gpus.000.limits.in_flight_bytes: 64MiB -> 32MiB"}));
  for (const auto& p : {a, MustParse("schedule: {kind: serial}\ngpus: [{match: GPU-1, schedule: {kind: geometric}, "
                                     "streams: {per_direction: 3}}, {match: 7, batching: {threshold: 0}}]\n")}) {
    const std::string yaml = p->ToYaml();
    auto back = ParsePolicy(yaml, "back.yaml");
    ASSERT_TRUE(back.ok()) << back.status().ToString() << "\n" << yaml;
    EXPECT_EQ((*back)->Canonical(), p->Canonical()) << yaml;
  }
}

struct BadPolicy {
  const char* text;
  const char* message;
};
class PolicyErrors : public ::testing::TestWithParam<BadPolicy> {};

TEST_P(PolicyErrors, NameFileLineColumnAndWhatWasExpected) {
  auto p = ParsePolicy(GetParam().text, "bad.yaml");
  ASSERT_FALSE(p.ok()) << GetParam().text;
  EXPECT_NE(p.status().message().find(GetParam().message), std::string::npos) << p.status().message();
}

INSTANTIATE_TEST_SUITE_P(
    All, PolicyErrors,
    ::testing::Values(
        BadPolicy{"shedule: {kind: serial}\n", "bad.yaml:1:1: unknown key 'shedule'"},
        BadPolicy{"schedule: {kind: fancy}\n",
                  "bad.yaml:1:18: schedule kind 'fancy' unknown (expected serial, side-stream, chunked or geometric)"},
        BadPolicy{"schedule: {chunk_size: 1MiB}\n", "bad.yaml:1:11: schedule needs a kind"},
        BadPolicy{"schedule:\n  kind: chunked\n  chunk_size: 1KiB\n", "bad.yaml:3:15: size 1KiB out of range"},
        BadPolicy{"schedule:\n  kind: chunked\n  ratio: 0.5\n", "bad.yaml:3:10: ratio applies to kind geometric only"},
        BadPolicy{"schedule: {kind: geometric, ratio: 1.5}\n",
                  "bad.yaml:1:36: expected a number in [0.05, 0.95], got '1.5'"},
        BadPolicy{"streams: {per_direction: 9}\n", "bad.yaml:1:26: value 9 out of range [1, 8]"},
        BadPolicy{"streams: {bulk_priority: medium}\n", "priority 'medium' unknown (expected greatest or least)"},
        BadPolicy{"schedule: {kind: serial}\nstreams: {per_direction: 2}\n",
                  "bad.yaml:2:26: a serial schedule uses one stream"},
        BadPolicy{"limits: {in_flight_bytes: lots}\n", "bad.yaml:1:27: expected a size"},
        BadPolicy{"limits: {in_flight_bytes: 1MiB, client_in_flight_bytes: 2MiB}\n",
                  "client_in_flight_bytes is above in_flight_bytes"},
        BadPolicy{"classes: []\n", "classes is a non-empty list"},
        BadPolicy{"classes: [{name: a}, {name: a}]\n", "class 'a' defined twice"},
        BadPolicy{"classes: [{name: a, weight: 0}]\n", "value 0 out of range [1, 1000]"},
        BadPolicy{"clients: [{name: x, class: nope}]\n", "class 'nope' is not defined in classes"},
        BadPolicy{"default_class: nope\n", "default_class 'nope' is not a defined class"},
        BadPolicy{"batching: {threshold: -1}\n", "bad.yaml:1:23"},
        BadPolicy{"batching: {join: lots}\n", "bad.yaml:1:18: expected a size"},
        BadPolicy{"batching: {joins: 4MiB}\n", "bad.yaml:1:12: unknown key 'joins'"},
        BadPolicy{"- just\n- a list\n", "a policy is a map of settings"},
        BadPolicy{"gpus: {match: 1}\n", "bad.yaml:1:7: gpus is a list of overrides"},
        BadPolicy{"gpus: [{limits: {in_flight_bytes: 1MiB}}]\n", "bad.yaml:1:8: an override needs match"},
        BadPolicy{"gpus: [{match: [], limits: {in_flight_bytes: 1MiB}}]\n", "bad.yaml:1:16: match names no GPU"},
        BadPolicy{"gpus: [{match: tesla, limits: {in_flight_bytes: 1MiB}}]\n",
                  "bad.yaml:1:16: 'tesla' is neither a GPU ordinal nor a GPU UUID"},
        BadPolicy{"gpus: [{match: 1, limits: {in_flight_bytes: 1MiB}}, {match: [2, 1], batching: {threshold: 0}}]\n",
                  "bad.yaml:1:65: GPU 1 is named by another override too"},
        BadPolicy{"gpus: [{match: 1}]\n", "bad.yaml:1:8: the override changes nothing"},
        BadPolicy{"gpus: [{match: 1, classes: [{name: b}]}]\n", "bad.yaml:1:19: unknown key 'classes'"},
        BadPolicy{"gpus: [{match: 1, limits: 5}]\n", "bad.yaml:1:27: expected a mapping"},
        BadPolicy{"limits: {client_in_flight_bytes: 64MiB}\ngpus: [{match: 1, limits: {in_flight_bytes: 1MiB}}]\n",
                  "client_in_flight_bytes is above in_flight_bytes (in the override for GPU 1)"},
        BadPolicy{"gpus: [{match: 0, schedule: {kind: chunked, chunk_size: 1KiB}}]\n",
                  "bad.yaml:1:57: size 1KiB out of range [65536, 4294967296] bytes (in the override for GPU 0)"},
        BadPolicy{"schedule: {kind: chunked\n", "bad.yaml:"}),
    [](const ::testing::TestParamInfo<BadPolicy>& info) { return "case" + std::to_string(info.index); });

struct Fixture {
  std::unique_ptr<Client> client;
  HostBuffer host;
  DeviceAllocation dev;
  DeviceRegion region;
};

Fixture NewClient(DaemonHarness& d, const std::string& name, size_t bytes) {
  auto c = d.Connect(name);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  auto h = (*c)->AllocateHost(bytes);
  auto dev = (*c)->AllocateDevice(bytes);
  EXPECT_TRUE(h.ok() && dev.ok());
  auto r = (*c)->RegisterDevice(dev->data(), dev->size());
  EXPECT_TRUE(r.ok());
  testing::FillRandom(h->data(), bytes, testing::RandomSeed());
  testing::Poison(static_cast<std::byte*>(dev->data()), bytes);
  return Fixture{std::move(*c), std::move(*h), std::move(*dev), std::move(*r)};
}

TEST(Scheduler, ALatencyCopyGoesAheadOfQueuedBulkWork) {
  auto inner = daemon::CreateHostBackend({daemon::kStreamsPerDirection});
  ASSERT_TRUE(inner.ok());
  auto backend = std::make_unique<PausableBackend>(std::move(*inner));
  PausableBackend* be = backend.get();
  auto policy = MustParse("schedule: {kind: chunked, chunk_size: 1MiB}\nlimits: {in_flight_bytes: 2MiB}\n");
  DaemonHarness d(DaemonHarness::SmallConfig(), std::move(backend), policy);
  Fixture f = NewClient(d, "mixed", 9 << 20);
  be->Pause(true);
  std::vector<Transfer> bulk;
  for (int i = 0; i < 8; ++i) {
    auto t = f.client->Copy(Direction::kHostToDevice, f.host, i << 20, f.region, i << 20, 1 << 20);
    ASSERT_TRUE(t.ok());
    bulk.push_back(std::move(*t));
  }
  // The engines are "busy": only the in-flight limit's worth of bulk went out.
  ASSERT_TRUE(DaemonHarness::Eventually([&] { return be->log().size() == 2; })) << be->log().size();
  std::this_thread::sleep_for(20ms);
  EXPECT_EQ(be->log().size(), 2u) << "bulk beyond in_flight_bytes must wait in ferryd";
  auto urgent = f.client->Copy(Direction::kHostToDevice, f.host, 8 << 20, f.region, 8 << 20, 4096,
                               {.priority = Priority::kLatency});
  ASSERT_TRUE(urgent.ok());
  ASSERT_TRUE(DaemonHarness::Eventually([&] { return be->log().size() == 3; }));
  auto log = be->log();
  EXPECT_EQ(log[2].stream, 0u) << "the latency copy goes to the latency stream";
  EXPECT_EQ(log[2].bytes, 4096u) << "and ahead of the six queued bulk chunks";
  be->Pause(false);
  ASSERT_OK(urgent->Wait(5s));
  for (auto& t : bulk) ASSERT_OK(t.Wait(5s));
  EXPECT_EQ(testing::FirstDifference(static_cast<std::byte*>(f.dev.data()), f.host.data(), (8 << 20) + 4096), -1);
  log = be->log();
  ASSERT_EQ(log.size(), 9u);
  for (size_t i = 3; i < log.size(); ++i) EXPECT_NE(log[i].stream, 0u) << "bulk never uses the latency stream";
}

// The engines write a latency copy's tag into its done word after its data: the client may
// return from the wait then, before ferryd has seen the copy done and posted its completion.
TEST(Scheduler, ALatencyCopyIsSeenDoneFromItsDoneWordBeforeItsCompletionArrives) {
  auto inner = daemon::CreateHostBackend({daemon::kStreamsPerDirection});
  ASSERT_TRUE(inner.ok());
  auto backend = std::make_unique<PausableBackend>(std::move(*inner));
  PausableBackend* be = backend.get();
  DaemonHarness d(DaemonHarness::SmallConfig(), std::move(backend));
  Fixture f = NewClient(d, "done-word", 1 << 20);
  ASSERT_OK_AND_ASSIGN(SharedEvent ev, f.client->CreateEvent());
  ASSERT_OK(ev.Record(nullptr));
  be->Pause(true);  // the engines run copies; ferryd sees none of them done
  auto* dev = static_cast<std::byte*>(f.dev.data());
  for (int round = 0; round < 24; ++round) {  // held completions: within the ring's 64 in flight
    const size_t at = static_cast<size_t>(round) * 8192;
    ASSERT_OK_AND_ASSIGN(Transfer up, f.client->Copy(Direction::kHostToDevice, f.host, at, f.region, at, 4096,
                                                     {.priority = Priority::kLatency}));
    ASSERT_OK(up.Wait(5s));
    ASSERT_EQ(testing::FirstDifference(dev + at, f.host.data() + at, 4096), -1) << "round " << round;
    EXPECT_GT(up.latency().count(), 0);
    testing::FillRandom(dev + at + 4096, 4096, testing::RandomSeed() + round);
    testing::Poison(f.host.data() + at + 4096, 4096);
    ASSERT_OK_AND_ASSIGN(Transfer down, f.client->Copy(Direction::kDeviceToHost, f.host, at + 4096, f.region,
                                                       at + 4096, 4096, {.priority = Priority::kLatency}));
    ASSERT_OK(down.Wait(5s));
    ASSERT_EQ(testing::FirstDifference(f.host.data() + at + 4096, dev + at + 4096, 4096), -1) << "round " << round;
  }
  // Neither a bulk copy nor one ordered after an event has a done word: they wait for ferryd.
  ASSERT_OK_AND_ASSIGN(Transfer bulk, f.client->Copy(Direction::kHostToDevice, f.host, 900 << 10, f.region, 900 << 10, 4096));
  ASSERT_OK_AND_ASSIGN(Transfer after, f.client->Copy(Direction::kHostToDevice, f.host, 950 << 10, f.region, 950 << 10,
                                                      4096, {.priority = Priority::kLatency, .after = &ev}));
  EXPECT_EQ(bulk.Wait(100ms).code(), Code::kTimeout);
  EXPECT_EQ(after.Wait(1ms).code(), Code::kTimeout);
  ASSERT_OK_AND_ASSIGN(DaemonStats held, f.client->Stats());
  be->Pause(false);
  ASSERT_OK(bulk.Wait(5s));
  ASSERT_OK(after.Wait(5s));
  ASSERT_TRUE(DaemonHarness::Eventually([&] {
    auto now = f.client->Stats();
    return now.ok() && now->copies_completed == held.copies_completed + 50;
  })) << "every copy's completion still comes once ferryd sees it done";
}

TEST(Scheduler, ACopyAfterAnEventIsHeldUntilTheEventHappensWhileOtherCopiesGoAhead) {
  auto inner = daemon::CreateHostBackend({daemon::kStreamsPerDirection});
  ASSERT_TRUE(inner.ok());
  auto backend = std::make_unique<PausableBackend>(std::move(*inner));
  PausableBackend* be = backend.get();
  DaemonHarness d(DaemonHarness::SmallConfig(), std::move(backend));
  Fixture f = NewClient(d, "after", 4 << 20);
  ASSERT_OK_AND_ASSIGN(SharedEvent ev, f.client->CreateEvent());
  be->HoldEvents(true);  // the client's kernel has not reached its record yet
  ASSERT_OK(ev.Record(nullptr));
  ASSERT_OK_AND_ASSIGN(Transfer held, f.client->Copy(Direction::kHostToDevice, f.host, 0, f.region, 0, 2 << 20, {.after = &ev}));
  ASSERT_OK_AND_ASSIGN(Transfer free, f.client->Copy(Direction::kHostToDevice, f.host, 2 << 20, f.region, 2 << 20, 2 << 20));
  ASSERT_OK(free.Wait(5s));  // a copy with no dependency is not stuck behind the held one
  std::this_thread::sleep_for(30ms);
  ASSERT_OK_AND_ASSIGN(bool done, held.Poll());
  EXPECT_FALSE(done) << "the copy ran before its event happened";
  const auto* dev = static_cast<const std::byte*>(f.dev.data());
  EXPECT_EQ(testing::FirstDifference(dev + (2 << 20), f.host.data() + (2 << 20), 2 << 20), -1);
  for (size_t i = 0; i < (2u << 20); ++i) ASSERT_EQ(dev[i], std::byte{0xA5}) << "held bytes landed at " << i << " (poison gone)";
  be->HoldEvents(false);
  ASSERT_OK(held.Wait(5s));
  EXPECT_EQ(testing::FirstDifference(dev, f.host.data(), 4 << 20), -1);

  // A client that goes away with a copy still held gets everything back.
  be->HoldEvents(true);
  const uint64_t pool = f.client->Stats()->pool_bytes;
  uint64_t free_before = 0;
  {
    Fixture g = NewClient(d, "after-dies", 1 << 20);
    ASSERT_OK_AND_ASSIGN(SharedEvent ev2, g.client->CreateEvent());
    ASSERT_OK_AND_ASSIGN(Transfer orphan, g.client->Copy(Direction::kHostToDevice, g.host, 0, g.region, 0, 1 << 20, {.after = &ev2}));
    free_before = f.client->Stats()->pool_free_bytes;
    ASSERT_OK_AND_ASSIGN(bool orphan_done, orphan.Poll());
    EXPECT_FALSE(orphan_done);
  }  // the client, its buffers, event and held copy all go away
  EXPECT_TRUE(DaemonHarness::Eventually([&] {
    auto st = f.client->Stats();
    return st.ok() && st->sessions == 1 && st->pool_free_bytes > free_before;
  })) << "the dead client's session and buffers were not reclaimed";
  EXPECT_LE(f.client->Stats()->pool_free_bytes, pool);
  be->HoldEvents(false);
}

double Jain(const std::vector<double>& x) {
  double s = 0, s2 = 0;
  for (double v : x) {
    s += v;
    s2 += v * v;
  }
  return s * s / (static_cast<double>(x.size()) * s2);
}

// Three clients of one class queue their whole backlog while the engines are held, so what
// the engines get once released depends on the scheduler alone (not on which client thread the
// machine ran first). Their copies differ in size, so the backend's log tells whose piece it was.
TEST(Scheduler, EqualWeightClientsGetEqualShares) {
  auto inner = daemon::CreateHostBackend({daemon::kStreamsPerDirection});
  auto backend = std::make_unique<PausableBackend>(std::move(*inner));
  PausableBackend* be = backend.get();
  auto policy = MustParse("schedule: {kind: chunked, chunk_size: 256KiB}\nlimits: {in_flight_bytes: 1MiB}\n");
  auto config = DaemonHarness::SmallConfig();
  config.pool_bytes = 128ull << 20;
  config.ring_entries = 128;
  DaemonHarness d(config, std::move(backend), policy);
  constexpr size_t kCount = 120;
  const size_t sizes[3] = {256 << 10, 192 << 10, 128 << 10};
  std::vector<Fixture> fx;
  for (int c = 0; c < 3; ++c) fx.push_back(NewClient(d, "client-" + std::to_string(c), sizes[c] * kCount));
  be->Pause(true);
  std::vector<Transfer> ts;
  for (size_t i = 0; i < kCount; ++i) {
    for (int c = 0; c < 3; ++c) {
      ASSERT_OK_AND_ASSIGN(Transfer t, fx[c].client->Copy(Direction::kHostToDevice, fx[c].host, i * sizes[c], fx[c].region,
                                                          i * sizes[c], sizes[c]));
      ts.push_back(std::move(t));
    }
  }
  ASSERT_TRUE(DaemonHarness::Eventually([&] { return d.counters().in_flight.load() == 3 * kCount; }, 30000))
      << "ferryd accepted " << d.counters().in_flight.load() << " of " << 3 * kCount << " copies";
  be->Pause(false);
  for (auto& t : ts) ASSERT_OK(t.Wait(30s));
  // Bytes each client had dispatched when the smallest backlog's last piece went out.
  std::vector<double> bytes(3, 0);
  for (const auto& e : be->log()) {
    if (bytes[2] == static_cast<double>(sizes[2] * kCount)) break;
    for (int c = 0; c < 3; ++c) {
      if (e.bytes == sizes[c]) bytes[c] += static_cast<double>(e.bytes);
    }
  }
  const double j = Jain(bytes);
  std::printf("bytes dispatched while all three had work: %.0f %.0f %.0f KiB, Jain index %.4f\n", bytes[0] / 1024,
              bytes[1] / 1024, bytes[2] / 1024, j);
  EXPECT_GE(j, 0.95);
  for (int c = 0; c < 3; ++c) {
    EXPECT_EQ(testing::FirstDifference(static_cast<std::byte*>(fx[c].dev.data()), fx[c].host.data(), sizes[c] * kCount), -1);
  }
}

// Both clients queue their whole backlog while the engines are held, so the order in which
// ferryd hands pieces to the engines depends on the scheduler alone. Their copies differ in
// size (256 KiB and 128 KiB), so the backend's log tells whose piece went out.
TEST(Scheduler, WeightsSetTheShares) {
  auto inner = daemon::CreateHostBackend({daemon::kStreamsPerDirection});
  auto backend = std::make_unique<PausableBackend>(std::move(*inner));
  PausableBackend* be = backend.get();
  auto policy = MustParse(
      "schedule: {kind: chunked, chunk_size: 256KiB}\nlimits: {in_flight_bytes: 1MiB}\n"
      "classes: [{name: big, weight: 3}, {name: small, weight: 1}]\n"
      "clients: [{name: 'big-*', class: big}]\ndefault_class: small\n");
  auto config = DaemonHarness::SmallConfig();
  config.pool_bytes = 128ull << 20;
  config.ring_entries = 128;
  DaemonHarness d(config, std::move(backend), policy);
  constexpr size_t kBig = 256 << 10, kSmall = 128 << 10, kCount = 120;
  Fixture big = NewClient(d, "big-1", kBig * kCount), small = NewClient(d, "other", kSmall * kCount);
  be->Pause(true);
  std::vector<Transfer> ts;
  for (size_t i = 0; i < kCount; ++i) {
    ts.push_back(*big.client->Copy(Direction::kHostToDevice, big.host, i * kBig, big.region, i * kBig, kBig));
    ts.push_back(*small.client->Copy(Direction::kHostToDevice, small.host, i * kSmall, small.region, i * kSmall, kSmall));
  }
  ASSERT_TRUE(DaemonHarness::Eventually([&] { return d.counters().in_flight.load() == 2 * kCount; }, 30000))
      << "ferryd accepted " << d.counters().in_flight.load() << " of " << 2 * kCount << " copies";
  be->Pause(false);
  for (auto& t : ts) ASSERT_OK(t.Wait(30s));
  // Bytes each client had dispatched when the heavy one's last piece went out.
  uint64_t big_bytes = 0, small_bytes = 0;
  for (const auto& e : be->log()) {
    if (big_bytes == kBig * kCount) break;
    (e.bytes == kBig ? big_bytes : small_bytes) += e.bytes;
  }
  const double ratio = static_cast<double>(big_bytes) / static_cast<double>(std::max<uint64_t>(small_bytes, 1));
  std::printf("weight 3 vs 1: %llu KiB vs %llu KiB dispatched while both had work: ratio %.2f\n",
              (unsigned long long)big_bytes >> 10, (unsigned long long)small_bytes >> 10, ratio);
  EXPECT_GT(ratio, 2.6);
  EXPECT_LT(ratio, 3.4);
  EXPECT_EQ(testing::FirstDifference(static_cast<std::byte*>(big.dev.data()), big.host.data(), kBig * kCount), -1);
  EXPECT_EQ(testing::FirstDifference(static_cast<std::byte*>(small.dev.data()), small.host.data(), kSmall * kCount), -1);
}

TEST(Scheduler, SerialRunsOneCopyAtATime) {
  auto inner = daemon::CreateHostBackend({daemon::kStreamsPerDirection});
  auto backend = std::make_unique<PausableBackend>(std::move(*inner));
  PausableBackend* be = backend.get();
  DaemonHarness d(DaemonHarness::SmallConfig(), std::move(backend), MustParse("schedule: {kind: serial}\n"));
  Fixture f = NewClient(d, "serial", 4 << 20);
  be->Pause(true);
  std::vector<Transfer> ts;
  for (int i = 0; i < 4; ++i) {
    ts.push_back(*f.client->Copy(Direction::kHostToDevice, f.host, i << 20, f.region, i << 20, 1 << 20));
  }
  ASSERT_TRUE(DaemonHarness::Eventually([&] { return be->log().size() == 1; }));
  std::this_thread::sleep_for(20ms);
  EXPECT_EQ(be->log().size(), 1u) << "serial: the next copy waits for the one before";
  be->Pause(false);
  for (auto& t : ts) ASSERT_OK(t.Wait(5s));
  EXPECT_EQ(be->log().size(), 4u);
  for (auto& e : be->log()) EXPECT_EQ(e.bytes, 1u << 20) << "serial copies go whole";
  EXPECT_EQ(testing::FirstDifference(static_cast<std::byte*>(f.dev.data()), f.host.data(), 4 << 20), -1);
}

// Replaces a policy file the way operators should (docs: write a new file, rename it over the
// old): a reload reads the old file or the new one, never half of one.
void ReplacePolicyFile(const std::string& file, const std::string& text) {
  const std::string tmp = file + ".new";
  std::ofstream(tmp) << text;
  std::filesystem::rename(tmp, file);
}

// The policy's staging settings reach a client with its ring at hello and again with each
// switch: the staged copy right after a switch already cuts its chunks the new way (the
// number of copies ferryd served tells the chunk size).
TEST(Staging, AStagedCopyRightAfterAPolicySwitchFollowsTheNewStagingSettings) {
  const std::string dir = testing::MakeTempDir("stg");
  const std::string file = dir + "/policy.yaml";
  ReplacePolicyFile(file, "staging: {chunk_size: 1MiB, threads: 2, buffers: 4}\n");
  auto config = DaemonHarness::SmallConfig();
  config.policy_path = file;
  config.pool_bytes = 64ull << 20;
  DaemonHarness d(config, nullptr, nullptr);
  ASSERT_OK_AND_ASSIGN(auto client, d.Connect("staged"));
  constexpr size_t n = 64ull << 20;  // 32 chunks of 2 MiB would fit: the policy's chunk is smaller
  ASSERT_OK_AND_ASSIGN(DeviceAllocation dev, client->AllocateDevice(n));
  ASSERT_OK_AND_ASSIGN(DeviceRegion region, client->RegisterDevice(dev.data(), dev.size()));
  std::vector<std::byte> src(n);
  auto staged_copies = [&](uint64_t seed) -> uint64_t {
    testing::FillRandom(src.data(), n, seed);
    testing::Poison(static_cast<std::byte*>(dev.data()), n);
    const uint64_t before = d.counters().copies_completed.load();
    const Status st = client->CopyStaged(Direction::kHostToDevice, src.data(), region, 0, n);
    EXPECT_TRUE(st.ok()) << st.ToString();
    EXPECT_EQ(testing::FirstDifference(static_cast<std::byte*>(dev.data()), src.data(), n), -1);
    return d.counters().copies_completed.load() - before;
  };
  EXPECT_EQ(staged_copies(testing::RandomSeed()), 64u) << "1 MiB chunks";
  ReplacePolicyFile(file, "staging: {chunk_size: 512KiB, threads: 2, buffers: 4}\n");
  d.server().RequestReload();
  ASSERT_TRUE(DaemonHarness::Eventually([&] { return d.counters().policy_switches.load() == 1; }, 20000));
  EXPECT_EQ(staged_copies(testing::RandomSeed() + 1), 128u) << "512 KiB chunks, at once";
  std::filesystem::remove_all(dir);
}

TEST(Scheduler, PoliciesSwitchUnderLoadAndNothingIsLost) {
  const std::string dir = testing::MakeTempDir("pol");
  const std::string file = dir + "/policy.yaml";
  const char* variants[] = {"schedule: {kind: chunked, chunk_size: 64KiB}\n", "schedule: {kind: geometric, min_chunk: 64KiB}\n",
                            "schedule: {kind: serial}\n", "schedule: {kind: side-stream}\nstreams: {per_direction: 3}\n"};
  ReplacePolicyFile(file, variants[0]);
  auto config = DaemonHarness::SmallConfig();
  config.policy_path = file;
  DaemonHarness d(config, nullptr, nullptr);
  Fixture f = NewClient(d, "steady", 2 << 20);
  std::atomic<bool> stop{false};
  std::atomic<int> copies{0}, bad{0};
  std::thread load;
  // Whatever assertion fails below, the load thread is stopped and joined (no std::terminate).
  struct StopAndJoin {
    std::atomic<bool>& stop;
    std::thread& t;
    ~StopAndJoin() {
      stop = true;
      if (t.joinable()) t.join();
    }
  } stop_and_join{stop, load};
  load = std::thread([&] {
    std::vector<std::byte> want(2 << 20);
    auto* dev = static_cast<std::byte*>(f.dev.data());
    for (uint64_t i = 0; !stop; ++i) {
      const size_t n = (1 << 20) + (i * 4099) % (1 << 20);
      testing::FillRandom(f.host.data(), n, i);
      testing::Poison(dev, n);
      auto t = f.client->Copy(Direction::kHostToDevice, f.host, 0, f.region, 0, n);
      if (!t.ok() || !t->Wait(5s).ok() || testing::FirstDifference(dev, f.host.data(), n) != -1) bad++;
      copies++;
    }
  });
  const std::string first = d.server().policy()->Hash();
  // Each switch waits for the one before: reloads asked for while one is still being read are
  // folded into one, so 21 quick requests need not make 21 switches.
  for (int i = 1; i <= 21; ++i) {
    ReplacePolicyFile(file, variants[i % 4]);
    d.server().RequestReload();
    ASSERT_TRUE(DaemonHarness::Eventually([&] { return d.counters().policy_switches.load() == static_cast<uint64_t>(i); },
                                          20000))
        << "switch " << i << " of 21; " << d.counters().policy_failures.load() << " refused";
  }
  EXPECT_EQ(d.counters().policy_failures.load(), 0u);
  // A broken file: refused, the last good policy keeps running.
  const std::string last_good = d.server().policy()->Hash();
  ReplacePolicyFile(file, "schedule: {kind: chunked, chunk_size: 12}\n");
  d.server().RequestReload();
  ASSERT_TRUE(DaemonHarness::Eventually([&] { return d.counters().policy_failures.load() == 1; }, 20000));
  EXPECT_EQ(d.server().policy()->Hash(), last_good);
  // Copies keep flowing under the last good policy (slowly under TSan: give them time).
  const int at_refusal = copies.load();
  EXPECT_TRUE(DaemonHarness::Eventually([&] { return copies.load() > std::max(20, at_refusal + 2); }, 20000));
  stop = true;
  load.join();
  EXPECT_NE(first, last_good);
  EXPECT_GT(copies.load(), 20);
  EXPECT_EQ(bad.load(), 0) << "of " << copies.load() << " copies";
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace ferry
