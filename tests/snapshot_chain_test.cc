// The signed snapshot chain against deletion, planted files and a careless key: ferryd's
// SnapshotWriter in-process, checked with the real ferryctl verify.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "common/signing.hpp"
#include "daemon/snapshots.hpp"
#include "test_util.hpp"

namespace ferry {
namespace {

namespace fs = std::filesystem;

class SnapshotChain : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::MakeTempDir("chain");
    ASSERT_FALSE(dir_.empty());
    ASSERT_TRUE(signing::GenerateKeyFiles(dir_, "k").ok());
    options_.dir = dir_ + "/snaps";
    options_.key_path = dir_ + "/k.key";
    options_.host_id = "test-host";
    options_.interval = std::chrono::hours(1);  // written by WriteNow only
    options_.on_failure = [this](std::string_view reason) { failures_.emplace_back(reason); };
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::unique_ptr<daemon::SnapshotWriter> Writer() {
    auto w = daemon::SnapshotWriter::Create(options_);
    EXPECT_TRUE(w.ok()) << w.status().ToString();
    return w.ok() ? std::move(*w) : nullptr;
  }
  std::string Record(uint64_t seq) {
    char name[64];
    std::snprintf(name, sizeof name, "/snapshot-%06llu.json", static_cast<unsigned long long>(seq));
    std::ifstream f(options_.dir + name);
    return std::string(std::istreambuf_iterator<char>(f), {});
  }
  // ferryctl verify's exit status and output.
  int Verify(const std::string& args, std::string* out) {
    const std::string log = dir_ + "/verify.txt";
    const std::string cmd = std::string(FERRY_CTL_PATH) + " verify --pub " + dir_ + "/k.pub " + args + " >" + log + " 2>&1";
    const int rc = std::system(cmd.c_str());
    std::ifstream f(log);
    *out = std::string(std::istreambuf_iterator<char>(f), {});
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  }

  std::string dir_;
  daemon::SnapshotOptions options_;
  std::vector<std::string> failures_;
};

TEST_F(SnapshotChain, AChainAcrossSequence999999VerifiesInSequenceOrderAndContinues) {
  options_.first_sequence = 999998;
  {
    auto w = Writer();
    ASSERT_NE(w, nullptr);
    for (int i = 0; i < 3; ++i) ASSERT_TRUE(w->WriteNow().ok());
    EXPECT_EQ(w->last_sequence(), 1000000u);
  }
  auto again = Writer();  // a restart: verifies the tail across the rollover and continues
  ASSERT_NE(again, nullptr);
  EXPECT_EQ(again->last_sequence(), 1000000u);
  ASSERT_TRUE(again->WriteNow().ok());
  EXPECT_EQ(Record(1000001).find("previous_chain_broken"), std::string::npos) << Record(1000001);
  std::string out;
  EXPECT_EQ(Verify("--from-seq 999998 " + options_.dir, &out), 0) << out;
  EXPECT_NE(out.find("sequences 999998..1000001"), std::string::npos) << out;
  // The records start at 999998 and do not say why: without --from-seq, that is a missing head.
  EXPECT_EQ(Verify(options_.dir, &out), 1) << out;
  EXPECT_NE(out.find("not the head of its chain"), std::string::npos) << out;
}

TEST_F(SnapshotChain, APlantedHighRecordDoesNotBecomeTheTail) {
  {
    auto w = Writer();
    ASSERT_NE(w, nullptr);
    ASSERT_TRUE(w->WriteNow().ok());
    ASSERT_TRUE(w->WriteNow().ok());
  }
  std::ofstream(options_.dir + "/snapshot-999999.json") << "{\"seq\": 999999, \"prev_sha256\": \"00\"}\n";
  auto w = Writer();
  ASSERT_NE(w, nullptr);
  ASSERT_TRUE(w->WriteNow().ok());
  const std::string head = Record(1000000);
  // Not continued from the planted file: a new chain, saying why, naming no previous record.
  EXPECT_NE(head.find("\"previous_chain_broken\": \"snapshot-999999.json does not verify"), std::string::npos) << head;
  EXPECT_NE(head.find("\"prev_sha256\": \"" + std::string(64, '0') + "\""), std::string::npos) << head;
  std::string out;
  EXPECT_EQ(Verify(options_.dir, &out), 1) << out;  // the planted file itself fails
  fs::remove(options_.dir + "/snapshot-999999.json");
  EXPECT_EQ(Verify(options_.dir, &out), 0) << out;  // two chains, the second's head says why
  EXPECT_NE(out.find("a new chain"), std::string::npos) << out;
  // A damaged newest record is not continued from either, and is not overwritten.
  const std::string damaged = Record(1000000) + " ";
  std::ofstream(options_.dir + "/snapshot-1000000.json") << damaged;
  w.reset();
  auto w2 = Writer();
  ASSERT_NE(w2, nullptr);
  ASSERT_TRUE(w2->WriteNow().ok());
  EXPECT_EQ(Record(1000000), damaged);
  EXPECT_NE(Record(1000001).find("previous_chain_broken"), std::string::npos) << Record(1000001);
}

TEST_F(SnapshotChain, AKeyOthersCanReadIsNotUsedToSign) {
  auto w = Writer();
  ASSERT_NE(w, nullptr);
  ASSERT_TRUE(w->WriteNow().ok());
  ASSERT_EQ(::chmod(options_.key_path.c_str(), 0644), 0);
  Status st = w->WriteNow();
  EXPECT_EQ(st.code(), Code::kPermissionDenied) << st.ToString();
  EXPECT_NE(st.message().find("chmod 600"), std::string::npos) << st.ToString();
  EXPECT_EQ(w->last_sequence(), 1u);
  EXPECT_EQ(failures_, std::vector<std::string>{"key_permissions"});
  EXPECT_FALSE(fs::exists(options_.dir + "/snapshot-000002.json"));
  // A symlink to the key is refused too, even with the right mode behind it.
  ASSERT_EQ(::chmod(options_.key_path.c_str(), 0600), 0);
  fs::rename(options_.key_path, dir_ + "/real.key");
  fs::create_symlink(dir_ + "/real.key", options_.key_path);
  st = w->WriteNow();
  EXPECT_EQ(st.code(), Code::kPermissionDenied) << st.ToString();
  EXPECT_NE(st.message().find("not a regular file"), std::string::npos) << st.ToString();
  // Fixed: signing resumes where the chain was.
  fs::remove(options_.key_path);
  fs::rename(dir_ + "/real.key", options_.key_path);
  ASSERT_TRUE(w->WriteNow().ok());
  EXPECT_EQ(w->last_sequence(), 2u);
  std::string out;
  EXPECT_EQ(Verify(options_.dir, &out), 0) << out;
}

}  // namespace
}  // namespace ferry
