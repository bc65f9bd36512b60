// idemctl_seed: a test helper that puts records into a store file the way the gateway would (claim,
// then complete or fail), so idemctl_store_test.sh can operate on them from another process.
//
//   idemctl_seed STORE_URL TENANT KEY STATE [--expired] [--stale-lease] [--status N] [--body TEXT]
//                [--header 'Name: value']...
//
// STATE is in_progress, completed or failed_retryable. --expired backdates the record past its
// retention; --stale-lease leaves an in_progress record whose lease ran out (a crashed holder).

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "idem/open_store.hpp"

namespace {

int usage(const std::string& why) {
  std::fprintf(stderr,
               "idemctl_seed: %s\nusage: idemctl_seed STORE_URL TENANT KEY STATE [--expired] [--stale-lease] "
               "[--status N] [--body TEXT] [--header 'Name: value']...\n",
               why.c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace idem;
  using namespace std::chrono_literals;
  if (argc < 5) return usage("missing arguments");
  const std::string url = argv[1];
  const RecordId id{argv[2], argv[3]};
  const auto state = parse_record_state(argv[4]);
  if (!state) return usage(std::string("unknown state ") + argv[4]);
  bool expired = false, stale_lease = false;
  StoredResponse response{201, {{"Content-Type", "application/json"}}, "{\"seeded\":true}"};
  bool headers_given = false;
  for (int i = 5; i < argc; ++i) {
    const std::string_view a = argv[i];
    if (a == "--expired") {
      expired = true;
    } else if (a == "--stale-lease") {
      stale_lease = true;
    } else if (a == "--status" && i + 1 < argc) {
      response.status = std::atoi(argv[++i]);
    } else if (a == "--body" && i + 1 < argc) {
      response.body = argv[++i];
    } else if (a == "--header" && i + 1 < argc) {
      if (!headers_given) response.headers.clear();
      headers_given = true;
      const std::string line = argv[++i];
      const auto colon = line.find(':');
      if (colon == std::string::npos) return usage("--header wants 'Name: value'");
      std::string value = line.substr(colon + 1);
      while (!value.empty() && value.front() == ' ') value.erase(0, 1);
      response.headers.push_back({line.substr(0, colon), value});
    } else {
      return usage("unknown argument " + std::string(a));
    }
  }

  auto opened = open_store(url);
  if (!opened) {
    std::fprintf(stderr, "idemctl_seed: %s\n", opened.error().message.c_str());
    return 1;
  }
  BlockingStore store(*opened->store);
  const TimePoint real_now = std::chrono::time_point_cast<Millis>(std::chrono::system_clock::now());
  // An expired record was made two days ago with a one-hour retention; a stale lease two minutes
  // ago with a one-minute lease.
  const TimePoint now = expired ? real_now - 48h : stale_lease ? real_now - 2min : real_now;
  ClaimRequest claim;
  claim.id = id;
  claim.request_hash = std::string(64, 'a');
  claim.token = new_fencing_token();
  claim.now = now;
  claim.lease_expires = now + 60s;
  claim.expires = now + (expired ? Millis(1h) : Millis(24h));
  auto claimed = store.claim(claim);
  if (!claimed || claimed->status != ClaimStatus::claimed) {
    std::fprintf(stderr, "idemctl_seed: claim failed: %s\n",
                 claimed ? "the record exists" : claimed.error().message.c_str());
    return 1;
  }
  const Fence fence{id, claim.token};
  StoreResult<FenceStatus> written = FenceStatus::ok;
  if (*state == RecordState::completed) {
    written = store.complete({fence, response, now, claim.expires});
  } else if (*state == RecordState::failed_retryable) {
    written = store.fail({fence, now, claim.expires});
  }
  if (!written || *written != FenceStatus::ok) {
    std::fprintf(stderr, "idemctl_seed: write failed\n");
    return 1;
  }
  return 0;
}
