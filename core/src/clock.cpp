#include "idem/clock.hpp"

namespace idem {

TimePoint SystemClock::now() const {
  return std::chrono::time_point_cast<Millis>(std::chrono::system_clock::now());
}

SystemClock& SystemClock::instance() {
  static SystemClock clock;
  return clock;
}

}  // namespace idem
