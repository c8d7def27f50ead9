// The overlap workload's host engine: the math on this thread's CPU, so the step loop, the
// checks and the report run through a ferryd on the host backend (CI has no GPU). "Enqueued"
// work runs at once, so marks read the host clock and the stream handle is unused.
#include <chrono>
#include <cstring>

#include "bench/overlap.hpp"
#include "common/environment.hpp"

namespace ferry::overlap {
namespace {

class HostStepEngine : public StepEngine {
 public:
  explicit HostStepEngine(int n) : n_(n), a_(Size()), b_(Size()) {
    for (auto& c : c_) c.assign(Size(), 0.0f);
    marks_.assign(kMaxMarks, 0.0);
  }
  std::string kind() const override { return "host"; }
  int n() const override { return n_; }
  std::vector<std::pair<std::string, std::string>> Environment() override {
    environment::Facts f;
    f.chip = "host CPU (no GPU)";
    f.no_gpu = "the host engine: the math runs on this CPU, no GPU";
    f.host_id = environment::HostIdFromEnv();
    return environment::Build(f);
  }
  Status SetInputs(const std::vector<float>& a, const std::vector<float>& b) override {
    if (a.size() != Size() || b.size() != Size()) return InvalidArgument("inputs are not n x n");
    a_ = a;
    b_ = b;
    return Status::Ok();
  }
  void* output(int buf) override { return out_[buf] ? out_[buf] : c_[buf].data(); }
  Status AdoptOutput(int buf, void* p) override {
    out_[buf] = static_cast<float*>(p);
    return Status::Ok();
  }

  Status Gemm(int buf, int col0, int col1, int) override {
    float* c = static_cast<float*>(output(buf));
    for (int j = col0; j < col1; ++j) {
      float* cj = c + static_cast<size_t>(j) * n_;
      std::fill(cj, cj + n_, 0.0f);
      for (int k = 0; k < n_; ++k) {
        const float bkj = b_[static_cast<size_t>(j) * n_ + k];
        const float* ak = a_.data() + static_cast<size_t>(k) * n_;
        for (int i = 0; i < n_; ++i) cj[i] += ak[i] * bkj;
      }
    }
    return Status::Ok();
  }
  Status PoisonOutput(int buf, uint8_t byte) override {
    std::memset(output(buf), byte, output_bytes());
    return Status::Ok();
  }
  void* stream(int) override { return nullptr; }
  Status Mark(int i) override {
    if (i < 0 || i >= kMaxMarks) return InvalidArgument("mark out of range");
    marks_[i] = std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
    return Status::Ok();
  }
  Result<double> MarkSeconds(int a, int b) override { return marks_[b] - marks_[a]; }
  Status WaitMark(int) override { return Status::Ok(); }
  Status Sync() override { return Status::Ok(); }
  Status ReadOutput(int buf, std::vector<float>& out) override {
    const float* c = static_cast<const float*>(output(buf));
    out.assign(c, c + Size());
    return Status::Ok();
  }

 private:
  size_t Size() const { return static_cast<size_t>(n_) * n_; }
  int n_;
  std::vector<float> a_, b_;
  std::vector<float> c_[2];
  float* out_[2] = {nullptr, nullptr};
  std::vector<double> marks_;
};

}  // namespace

std::unique_ptr<StepEngine> MakeHostStepEngine(int n) { return std::make_unique<HostStepEngine>(n); }

}  // namespace ferry::overlap
