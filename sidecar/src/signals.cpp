#include <csignal>
#include <cstdlib>
#include <ctime>
#include <atomic>
#include <thread>

#include "idem/sidecar/settings.hpp"

namespace idem::sidecar {
namespace {

sigset_t stop_set() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGHUP);
  return set;
}

}  // namespace

void block_stop_signals() {
  const sigset_t set = stop_set();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

struct StopSignals::Impl {
  std::atomic<bool> done{false};
  std::thread thread;
};

StopSignals::StopSignals(std::function<void(int)> stop, std::function<void()> hangup) : impl_(new Impl) {
  block_stop_signals();
  impl_->thread = std::thread([impl = impl_, stop = std::move(stop), hangup = std::move(hangup)] {
    const sigset_t set = stop_set();
    bool stopping = false;
    while (!impl->done.load()) {
      // A timed wait, so that the destructor can end this thread without a signal of its own.
      const timespec tick{0, 200'000'000};
      const int sig = sigtimedwait(&set, nullptr, &tick);
      if (sig < 0) continue;
      if (sig == SIGHUP) {
        if (hangup) hangup();
        continue;
      }
      if (stopping) std::_Exit(1);  // a second SIGTERM/SIGINT: the operator wants it gone now
      stopping = true;
      stop(sig);
    }
  });
}

StopSignals::~StopSignals() {
  impl_->done.store(true);
  if (impl_->thread.joinable()) impl_->thread.join();
  delete impl_;
}

}  // namespace idem::sidecar
