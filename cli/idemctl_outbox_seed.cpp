// idemctl_outbox_seed: a test helper for idemctl_outbox_test.sh, playing the parts around an
// outbox that idemctl does not: the service's store (which creates the table) and idem-relay.
//
//   idemctl_outbox_seed create URL   opens the store at URL (migrations create idem_outbox)
//   idemctl_outbox_seed hold URL     takes the relay's place: opens a relay reader, prints
//                                    "holding", and keeps it until standard input closes
//   idemctl_outbox_seed relay URL    claims every due row and settles it as sent; prints the ids

#include <cstdio>
#include <string>

#include "idem/open_store.hpp"

namespace {

int usage(const char* why) {
  std::fprintf(stderr, "idemctl_outbox_seed: %s\nusage: idemctl_outbox_seed create|hold|relay URL\n", why);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace idem;
  if (argc != 3) return usage("expected a command and a URL");
  const std::string command = argv[1];
  const std::string url = argv[2];
  if (command == "create") {
    auto store = open_store(url);
    if (!store) return std::fprintf(stderr, "idemctl_outbox_seed: %s\n", store.error().message.c_str()), 1;
    return 0;
  }
  if (command != "hold" && command != "relay") return usage("unknown command");
  auto reader = open_outbox_reader(url);
  if (!reader) return std::fprintf(stderr, "idemctl_outbox_seed: %s\n", reader.error().message.c_str()), 1;
  if (command == "hold") {
    std::printf("holding\n");
    std::fflush(stdout);
    while (std::fgetc(stdin) != EOF) {
    }
    return 0;
  }
  const std::string owner = "seed-relay";
  for (;;) {
    auto rows = (*reader)->claim(OutboxClaim{100, SystemClock::instance().now(), std::chrono::seconds(30), owner});
    if (!rows) return std::fprintf(stderr, "idemctl_outbox_seed: %s\n", rows.error().message.c_str()), 1;
    if (rows->empty()) return 0;
    std::vector<OutboxResult> results;
    for (const OutboxRow& row : *rows) {
      std::printf("%lld\n", static_cast<long long>(row.id));
      results.push_back({row.id, OutboxResult::Kind::sent, "", {}});
    }
    if (auto settled = (*reader)->settle(results, SystemClock::instance().now(), owner); !settled) {
      return std::fprintf(stderr, "idemctl_outbox_seed: %s\n", settled.error().message.c_str()), 1;
    }
  }
}
