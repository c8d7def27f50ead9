// The overlap workload's GPU engine: cuBLAS sgemm on one stream of this process, timing events
// for the step marks, and (for the in-process baselines) pinned buffers and a copy stream.
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <array>
#include <cstdio>

#include "bench/overlap.hpp"
#include "common/cuda_clock.hpp"
#include "common/cuda_status.hpp"
#include "common/environment.hpp"
#include "common/gpu_uuid.hpp"
#include "common/status_macros.hpp"

namespace ferry::overlap {
namespace {

Status CublasStatus(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return Status::Ok();
  return Internal(std::string(what) + ": cuBLAS status " + std::to_string(static_cast<int>(s)));
}

class CudaStepEngine : public StepEngine {
 public:
  CudaStepEngine(int device, int n) : device_(device), n_(n) {}

  Status Init() {
    FERRY_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    FERRY_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    FERRY_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking));
    const size_t bytes = output_bytes();
    FERRY_CUDA_RETURN_IF_ERROR(cudaMalloc(reinterpret_cast<void**>(&a_), bytes));
    FERRY_CUDA_RETURN_IF_ERROR(cudaMalloc(reinterpret_cast<void**>(&b_), bytes));
    for (int i = 0; i < 2; ++i) {
      FERRY_CUDA_RETURN_IF_ERROR(cudaMalloc(reinterpret_cast<void**>(&c_[i]), bytes));
      FERRY_CUDA_RETURN_IF_ERROR(cudaMallocHost(&pinned_[i], bytes));
    }
    FERRY_RETURN_IF_ERROR(CublasStatus(cublasCreate(&blas_), "cublasCreate"));
    FERRY_RETURN_IF_ERROR(CublasStatus(cublasSetStream(blas_, stream_), "cublasSetStream"));
    // Plain FP32 (no TF32 tensor-op math): the bounds of the correctness checks are written for it.
    FERRY_RETURN_IF_ERROR(CublasStatus(cublasSetMathMode(blas_, CUBLAS_DEFAULT_MATH), "cublasSetMathMode"));
    for (auto& e : ready_) FERRY_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    for (auto& e : done_) FERRY_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    marks_.assign(kMaxMarks, nullptr);
    return Status::Ok();
  }

  ~CudaStepEngine() override {
    cudaSetDevice(device_);
    if (stream_) cudaStreamSynchronize(stream_);
    if (copy_stream_) cudaStreamSynchronize(copy_stream_);
    for (cudaStream_t s : lane_streams_) cudaStreamSynchronize(s);
    if (blas_) cublasDestroy(blas_);
    for (cublasHandle_t h : lane_blas_) cublasDestroy(h);
    for (cudaStream_t s : lane_streams_) cudaStreamDestroy(s);
    for (cudaEvent_t e : lane_done_)
      if (e) cudaEventDestroy(e);
    if (fork_) cudaEventDestroy(fork_);
    for (cudaEvent_t e : marks_)
      if (e) cudaEventDestroy(e);
    if (clock_origin_) cudaEventDestroy(clock_origin_);
    for (cudaEvent_t e : ready_)
      if (e) cudaEventDestroy(e);
    for (cudaEvent_t e : done_)
      if (e) cudaEventDestroy(e);
    cudaFree(a_);
    cudaFree(b_);
    for (int i = 0; i < 2; ++i) {
      cudaFree(c_[i]);
      cudaFreeHost(pinned_[i]);
    }
    if (stream_) cudaStreamDestroy(stream_);
    if (copy_stream_) cudaStreamDestroy(copy_stream_);
  }

  std::string kind() const override { return "cuda"; }
  int n() const override { return n_; }

  std::vector<std::pair<std::string, std::string>> Environment() override {
    cudaDeviceProp prop{};
    cudaGetDeviceProperties(&prop, device_);
    environment::Facts f;
    f.chip = prop.name;
    f.gpu_uuid = FormatGpuUuid(reinterpret_cast<const uint8_t*>(prop.uuid.bytes));
    cudaDriverGetVersion(&f.cuda_driver);
    cudaRuntimeGetVersion(&f.cuda_runtime);
    int cublas = 0;
    if (cublasGetVersion(blas_, &cublas) == CUBLAS_STATUS_SUCCESS) {
      f.cublas = std::to_string(cublas / 10000) + "." + std::to_string(cublas / 100 % 100) + "." +
                 std::to_string(cublas % 100);
    }
    f.host_id = environment::HostIdFromEnv();
    environment::Block b = environment::Build(f);
    b.emplace_back("copy_engines", std::to_string(prop.asyncEngineCount));
    return b;
  }

  Status SetInputs(const std::vector<float>& a, const std::vector<float>& b) override {
    FERRY_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    FERRY_CUDA_RETURN_IF_ERROR(cudaMemcpy(a_, a.data(), output_bytes(), cudaMemcpyHostToDevice));
    FERRY_CUDA_RETURN_IF_ERROR(cudaMemcpy(b_, b.data(), output_bytes(), cudaMemcpyHostToDevice));
    return Status::Ok();
  }
  void* output(int buf) override { return c_[buf]; }

  Status Gemm(int buf, int col0, int col1, int lane) override {
    if (lane < 0 || lane >= lanes()) return InvalidArgument("no compute lane " + std::to_string(lane));
    const float one = 1, zero = 0;
    return CublasStatus(
        cublasSgemm(lane == 0 ? blas_ : lane_blas_[lane - 1], CUBLAS_OP_N, CUBLAS_OP_N, n_, col1 - col0, n_, &one, a_,
                    n_, b_ + static_cast<size_t>(col0) * n_, n_, &zero, c_[buf] + static_cast<size_t>(col0) * n_, n_),
        "cublasSgemm");
  }

  // Lane 0 is the step stream; each other lane has a stream and a cuBLAS handle of its own (a
  // handle's workspace must not be shared by kernels running at once).
  Status SetLanes(int lanes) override {
    if (lanes < 1 || lanes > 8) return InvalidArgument("1 to 8 compute lanes");
    while (this->lanes() < lanes) {
      cudaStream_t s;
      FERRY_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
      lane_streams_.push_back(s);
      cublasHandle_t h;
      FERRY_RETURN_IF_ERROR(CublasStatus(cublasCreate(&h), "cublasCreate"));
      lane_blas_.push_back(h);
      FERRY_RETURN_IF_ERROR(CublasStatus(cublasSetStream(h, s), "cublasSetStream"));
      FERRY_RETURN_IF_ERROR(CublasStatus(cublasSetMathMode(h, CUBLAS_DEFAULT_MATH), "cublasSetMathMode"));
      for (cudaEvent_t* e : {&fork_, &lane_done_[lane_streams_.size() - 1]}) {
        if (*e == nullptr) FERRY_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(e, cudaEventDisableTiming));
      }
    }
    active_lanes_ = lanes;
    return Status::Ok();
  }
  Status ForkLanes() override {
    if (active_lanes_ == 1) return Status::Ok();
    FERRY_CUDA_RETURN_IF_ERROR(cudaEventRecord(fork_, stream_));
    for (int l = 1; l < active_lanes_; ++l)
      FERRY_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(lane_streams_[l - 1], fork_, 0));
    return Status::Ok();
  }
  Status JoinLanes() override {
    for (int l = 1; l < active_lanes_; ++l) {
      FERRY_CUDA_RETURN_IF_ERROR(cudaEventRecord(lane_done_[l - 1], lane_streams_[l - 1]));
      FERRY_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream_, lane_done_[l - 1], 0));
    }
    return Status::Ok();
  }
  Status PoisonOutput(int buf, uint8_t byte) override {
    return CudaStatus(cudaMemsetAsync(c_[buf], byte, output_bytes(), stream_), "cudaMemsetAsync");
  }
  void* stream(int lane) override { return lane <= 0 || lane >= lanes() ? stream_ : lane_streams_[lane - 1]; }

  Status Mark(int i) override {
    if (i < 0 || i >= kMaxMarks) return InvalidArgument("mark out of range");
    if (!marks_[i]) FERRY_CUDA_RETURN_IF_ERROR(cudaEventCreate(&marks_[i]));
    return CudaStatus(cudaEventRecord(marks_[i], stream_), "cudaEventRecord");
  }
  Result<double> MarkSeconds(int a, int b) override {
    float ms = 0;
    FERRY_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, marks_[a], marks_[b]));
    return static_cast<double>(ms) * 1e-3;
  }
  Status WaitMark(int i) override { return CudaStatus(cudaEventSynchronize(marks_[i]), "cudaEventSynchronize"); }
  Result<double> MarkClockMicros(int i) override {
    if (clock_origin_ == nullptr) FERRY_RETURN_IF_ERROR(PinClock());
    float ms = 0;
    FERRY_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, clock_origin_, marks_[i]));
    return static_cast<double>(clock_origin_ns_) / 1e3 + static_cast<double>(ms) * 1e3;
  }
  Status Sync() override {
    for (cudaStream_t s : lane_streams_) FERRY_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s));
    FERRY_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(copy_stream_));
    return CudaStatus(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  }
  Status ReadOutput(int buf, std::vector<float>& out) override {
    FERRY_RETURN_IF_ERROR(Sync());
    out.resize(static_cast<size_t>(n_) * n_);
    return CudaStatus(cudaMemcpy(out.data(), c_[buf], output_bytes(), cudaMemcpyDeviceToHost), "cudaMemcpy");
  }

  bool has_in_process() const override { return true; }

  // MarkClockMicros' time zero: an event on the step stream, lined up with CLOCK_MONOTONIC as
  // ferryd's engine trace lines up its own (PinEventToHostClock).
  Status PinClock() override {
    cudaEvent_t origin = nullptr;
    FERRY_CUDA_RETURN_IF_ERROR(cudaEventCreate(&origin));
    auto pinned = PinEventToHostClock(origin, stream_);
    if (!pinned.ok()) {
      cudaEventDestroy(origin);
      return pinned.status();
    }
    if (clock_origin_ != nullptr) cudaEventDestroy(clock_origin_);
    clock_origin_ = origin;
    clock_origin_ns_ = pinned->origin_ns;
    return Status::Ok();
  }
  std::byte* pinned(int buf) override { return static_cast<std::byte*>(pinned_[buf]); }
  Status CopyOnStream(int buf, size_t offset, size_t bytes) override {
    return CudaStatus(
        cudaMemcpyAsync(static_cast<std::byte*>(pinned_[buf]) + offset, reinterpret_cast<std::byte*>(c_[buf]) + offset,
                        bytes, cudaMemcpyDeviceToHost, stream_),
        "cudaMemcpyAsync");
  }
  Result<int> CopyOnSideStream(int buf, size_t offset, size_t bytes, int lane) override {
    const int t = next_token_++ % static_cast<int>(done_.size());
    FERRY_CUDA_RETURN_IF_ERROR(cudaEventRecord(ready_[t], static_cast<cudaStream_t>(stream(lane))));
    FERRY_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(copy_stream_, ready_[t], 0));
    FERRY_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(static_cast<std::byte*>(pinned_[buf]) + offset,
                                               reinterpret_cast<std::byte*>(c_[buf]) + offset, bytes,
                                               cudaMemcpyDeviceToHost, copy_stream_));
    FERRY_CUDA_RETURN_IF_ERROR(cudaEventRecord(done_[t], copy_stream_));
    return t;
  }
  Status StreamWaitCopy(int token) override {
    return CudaStatus(cudaStreamWaitEvent(stream_, done_[token], 0), "cudaStreamWaitEvent");
  }

 private:
  int device_, n_;
  cudaStream_t stream_ = nullptr, copy_stream_ = nullptr;
  cublasHandle_t blas_ = nullptr;
  float* a_ = nullptr;
  float* b_ = nullptr;
  float* c_[2] = {nullptr, nullptr};
  void* pinned_[2] = {nullptr, nullptr};
  std::vector<cudaEvent_t> marks_;
  cudaEvent_t clock_origin_ = nullptr;  // MarkClockMicros' time zero, made on first use
  uint64_t clock_origin_ns_ = 0;        // ... on CLOCK_MONOTONIC
  int lanes() const { return 1 + static_cast<int>(lane_streams_.size()); }
  std::vector<cudaStream_t> lane_streams_;  // lanes 1.. (lane 0 is stream_)
  std::vector<cublasHandle_t> lane_blas_;
  std::array<cudaEvent_t, 8> lane_done_{};
  cudaEvent_t fork_ = nullptr;
  int active_lanes_ = 1;
  // Tokens are reused after 64 copies; the step loop keeps far fewer in flight.
  std::array<cudaEvent_t, 64> ready_{}, done_{};
  int next_token_ = 0;
};

}  // namespace

Result<std::unique_ptr<StepEngine>> MakeCudaStepEngine(int device, int n) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || device >= count) {
    cudaGetLastError();
    return Unavailable("no CUDA device " + std::to_string(device) + " in this process");
  }
  auto e = std::make_unique<CudaStepEngine>(device, n);
  FERRY_RETURN_IF_ERROR(e->Init());
  return std::unique_ptr<StepEngine>(std::move(e));
}

}  // namespace ferry::overlap
