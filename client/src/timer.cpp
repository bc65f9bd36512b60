#include "idem/client/timer.hpp"

#include <thread>

namespace idem::client {

SteadyTime SystemTimer::now() const { return std::chrono::steady_clock::now(); }

TimePoint SystemTimer::wall_now() const {
  return std::chrono::time_point_cast<Millis>(std::chrono::system_clock::now());
}

void SystemTimer::sleep_for(Millis d) {
  if (d.count() > 0) std::this_thread::sleep_for(d);
}

}  // namespace idem::client
