// A hazard of docs/design.md ("Known hazards"), found: prometheus-cpp's exposer fails with "null context when constructing
// CivetServer" in any process whose static thread-local storage does not fit in the 100 KiB
// stacks Debian's civetweb gives its threads. Boost.Interprocess has nothing to do with it (it
// has no thread-local storage; metrics_test maps its regions around a working exporter).
//
// This file is built twice: with a 96 KiB thread_local of its own, and, where the CUDA toolkit
// is present, linked with the real cuBLAS instead (libcublasLt.so.13 carries 92 KiB of TLS).
// Either way the exporter must refuse to start with the cause and its owners named, instead
// of civetweb's "possible problem binding to port".
#include <gtest/gtest.h>

#include <array>
#include <cstdio>

#include "daemon/metrics.hpp"

#if defined(FERRY_TLS_FROM_CUBLAS)
#include <cublas_api.h>
#else
thread_local std::array<char, 96 * 1024> tls_ballast;
#endif

namespace ferry {
namespace {

void TouchTheTlsOwner() {
#if defined(FERRY_TLS_FROM_CUBLAS)
  int major = 0;
  ASSERT_EQ(cublasGetProperty(MAJOR_VERSION, &major), CUBLAS_STATUS_SUCCESS);  // no GPU needed
  EXPECT_GE(major, 12);
#else
  tls_ballast.fill(1);
  EXPECT_EQ(tls_ballast[1000], 1);
#endif
}

TEST(MetricsStaticTls, AProcessWhoseStaticTlsOutgrowsCivetwebsThreadStacksGetsTheCauseNotANullContext) {
#if defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "ThreadSanitizer's pthread_create enlarges small thread stacks: the hazard does not exist under it";
#endif
  TouchTheTlsOwner();
  auto m = daemon::MetricsExporter::Create("127.0.0.1:0", {"test", {"host", 0, "host", "", 0, 0, "", -1, ""}, {}});
  ASSERT_FALSE(m.ok()) << "the exporter started although civetweb's threads cannot";
  EXPECT_EQ(m.status().code(), Code::kUnavailable);
  const std::string& why = m.status().message();
  EXPECT_NE(why.find("cannot serve metrics on 127.0.0.1:0"), std::string::npos) << why;
  EXPECT_NE(why.find("100 KiB stack"), std::string::npos) << why;
  EXPECT_NE(why.find("static thread-local storage"), std::string::npos) << why;
#if defined(FERRY_TLS_FROM_CUBLAS)
  EXPECT_NE(why.find("libcublasLt.so"), std::string::npos) << "the owner is named: " << why;
#else
  EXPECT_NE(why.find("the executable 9"), std::string::npos) << "the owner is named: " << why;
#endif
  EXPECT_EQ(why.find("null context"), std::string::npos) << why;
  std::printf("the exporter said: %s\n", why.c_str());
}

}  // namespace
}  // namespace ferry
