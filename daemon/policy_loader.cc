#include "daemon/policy_loader.hpp"

#include <exception>
#include <system_error>

#include "common/status_macros.hpp"
#include "common/yaml_util.hpp"

namespace ferry::daemon {

Result<std::unique_ptr<PolicyLoader>> PolicyLoader::Create(std::function<void(const std::string&)> before_parse) {
  std::unique_ptr<PolicyLoader> l(new PolicyLoader());
  l->before_parse_ = std::move(before_parse);
  FERRY_ASSIGN_OR_RETURN(l->done_efd_, CreateEventFd());
  try {
    l->worker_ = std::thread([p = l.get()] { p->Work(); });
  } catch (const std::system_error& e) {
    return ResourceExhausted(std::string("cannot start the policy loader thread: ") + e.what());
  }
  return l;
}

PolicyLoader::~PolicyLoader() {
  {
    std::lock_guard<std::mutex> g(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (worker_.joinable()) worker_.join();
}

bool PolicyLoader::Submit(PolicyLoad load) {
  {
    std::lock_guard<std::mutex> g(mu_);
    if (load.reload) {
      for (const PolicyLoad& w : waiting_) {
        if (w.reload) return true;
      }
    }
    if (waiting_.size() >= kMaxQueued) return false;
    waiting_.push_back(std::move(load));
  }
  wake_.notify_one();
  return true;
}

std::vector<PolicyLoad> PolicyLoader::TakeDone() {
  DrainDoorbell(done_efd_.get());
  std::lock_guard<std::mutex> g(mu_);
  return std::exchange(done_, {});
}

void PolicyLoader::Work() {
  for (;;) {
    PolicyLoad load;
    {
      std::unique_lock<std::mutex> g(mu_);
      wake_.wait(g, [&] { return stopping_ || !waiting_.empty(); });
      if (stopping_) return;
      load = std::move(waiting_.front());
      waiting_.pop_front();
    }
    Load(load);
    try {
      std::lock_guard<std::mutex> g(mu_);
      done_.push_back(std::move(load));
    } catch (...) {  // out of memory: the load is lost, but ferryd lives on
      continue;
    }
    RingDoorbell(done_efd_.get());
  }
}

void PolicyLoader::Load(PolicyLoad& load) {
  // Nothing may escape this thread: an exception here would end ferryd.
  try {
    if (before_parse_) before_parse_(load.name);
    Result<std::shared_ptr<const Policy>> p = InvalidArgument("no policy file given");
    if (!load.path.empty()) {
      p = LoadPolicyFile(load.path);
    } else {
      Result<std::string> text = yamlutil::ReadYamlFd(load.fd.get(), load.name);
      p = text.ok() ? ParsePolicy(*text, load.name) : Result<std::shared_ptr<const Policy>>(text.status());
    }
    load.fd.reset();
    if (p.ok()) {
      load.policy = *p;
      load.status = Status::Ok();
    } else {
      load.status = p.status();
    }
  } catch (const std::exception& e) {
    load.status = Internal(std::string("reading the policy failed: ") + e.what());
  } catch (...) {
    load.status = Internal("reading the policy failed: an exception that is not a std::exception");
  }
}

}  // namespace ferry::daemon
