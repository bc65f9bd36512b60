// The gateway's TOML configuration loader: any text is a Config or one ConfigError, never a
// crash or another exception.
#include <string>
#include <string_view>

#include "check.hpp"
#include "idem/gateway/config.hpp"
#include "idem/gateway/routes.hpp"

extern "C" int LLVMFuzzerTestOneInput(const unsigned char* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const idem::gateway::Config config = idem::gateway::parse_config(text, "fuzz.toml");
    // What the gateway does next with a loaded configuration: route requests with it.
    const idem::gateway::Router router(config.routes, config.defaults);
    (void)router.match("POST", "/");
    (void)router.match("PATCH", "/v1/payments/123");
    for (const auto& route : config.routes) {
      FUZZ_CHECK(route.policy.key.min_length <= route.policy.key.max_length, "key bounds are ordered");
    }
  } catch (const idem::gateway::ConfigError& e) {
    const std::string_view message = e.what();
    FUZZ_CHECK(!message.empty(), "an error says what is wrong");
    if (message.find('\n') != std::string_view::npos) std::fprintf(stderr, "message: %s\n", e.what());
    FUZZ_CHECK(message.find('\n') == std::string_view::npos, "an error is one line");
  }
  return 0;
}
