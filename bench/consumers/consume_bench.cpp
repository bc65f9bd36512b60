// idem-consume-bench: consumer throughput on a real broker, each mode against the same messages.
//
//   idem-consume-bench publish SINK_URL N [BODY_BYTES [KEYS]]
//                                                         publishes N messages (ids bench-0..N-1),
//                                                         confirmed, in batches; prints msgs/s;
//                                                         KEYS > 0: message i has ordering key
//                                                         k(i % KEYS)
//   idem-consume-bench raw SOURCE_URL N                   the baseline: receive, ack at once, no store
//   idem-consume-bench inprocess SOURCE_URL N STORE_URL [key|key-pass|single]
//                                                         the batched ConsumeLoop (a no-op effect;
//                                                         claims per receive, completions shared);
//                                                         "single": ConsumeLoop + process_once (a
//                                                         claim and a completion per message);
//                                                         "key": ordering = key with
//                                                         keys held behind dead letters in the
//                                                         store (idem-consume's default: a hold
//                                                         read per keyed message); "key-pass":
//                                                         ordering = key without holds
//   idem-consume-bench raw-http SOURCE_URL N HANDLER_URL  the sidecar's baseline: receive, POST each
//                                                         to the handler (libcurl, 8 at once), ack;
//                                                         no store
//   idem-consume-bench outbox-raw SINK_URL N              the relay's baseline: publish N messages
//                                                         in batches of 100, waiting for confirms
//
// Each mode consumes until N messages were settled and prints one line of JSON: mode, messages,
// seconds, msgs_per_s, cpu_us_per_msg (this process's user+system CPU per message).
// Same prefetch (64) and workers (8) everywhere.
#include <sys/resource.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "idem/client/curl_transport.hpp"
#include "idem/consume_loop.hpp"
#include "idem/open_broker.hpp"
#include "idem/open_store.hpp"

namespace {

using namespace idem;
using Steady = std::chrono::steady_clock;
constexpr std::size_t kPrefetch = 64;
constexpr std::size_t kWorkers = 8;

double cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "idem-consume-bench: %s\n", what.c_str());
  std::exit(1);
}

void report(const char* mode, std::size_t n, Steady::time_point t0, double cpu0) {
  const double seconds = std::chrono::duration<double>(Steady::now() - t0).count();
  const double cpu = cpu_seconds() - cpu0;
  std::printf("{\"mode\":\"%s\",\"messages\":%zu,\"seconds\":%.3f,\"msgs_per_s\":%.0f,\"cpu_us_per_msg\":%.2f}\n", mode,
              n, seconds, static_cast<double>(n) / seconds, cpu * 1e6 / static_cast<double>(n));
}

SourceSettings settings() {
  SourceSettings s;
  s.prefetch = kPrefetch;
  s.consumer = "bench";
  return s;
}

std::unique_ptr<MessageSource> source_or_die(const std::string& url) {
  auto s = open_source(url, settings());
  if (!s) die(s.error().message);
  return std::move(*s);
}

int publish(const std::string& url, std::size_t n, std::size_t body_bytes, const char* mode, std::size_t keys = 0) {
  auto sink = open_sink(url, {});
  if (!sink) die(sink.error().message);
  const auto t0 = Steady::now();
  const double cpu0 = cpu_seconds();
  std::vector<OutgoingMessage> batch;
  for (std::size_t i = 0; i < n; ++i) {
    OutgoingMessage m;
    m.message_id = "bench-" + std::to_string(i);
    m.content_type = "application/json";
    m.body = std::string(body_bytes, 'x');
    if (keys > 0) {
      m.ordering_key = std::to_string(i % keys);
      m.ordering_key.insert(0, 1, 'k');  // not "k" + ...: GCC 12 warns (-Wrestrict) on that
    }
    batch.push_back(std::move(m));
    if (batch.size() == 100 || i + 1 == n) {
      for (const auto& r : (*sink)->publish(batch)) {
        if (!r) die("publish: " + r.error().message);
      }
      batch.clear();
    }
  }
  report(mode, n, t0, cpu0);
  return 0;
}

int raw(const std::string& url, std::size_t n) {
  auto source = source_or_die(url);
  std::size_t done = 0;
  Steady::time_point t0{};
  double cpu0 = 0;
  while (done < n) {
    auto got = source->receive(kPrefetch, std::chrono::seconds(5));
    if (!got) die(got.error().message);
    if (got->empty()) die("no more messages after " + std::to_string(done));
    if (done == 0) {
      t0 = Steady::now();  // from the first delivery: connecting is not consuming
      cpu0 = cpu_seconds();
    }
    if (auto acked = source->ack(*got); !acked) die(acked.error().message);
    done += got->size();
  }
  report("raw", done, t0, cpu0);
  return 0;
}

// Runs a ConsumeLoop that `make` builds (the processor form or the batched one) until n deliveries
// were settled.
template <class Make>
int run_loop_until(const char* mode, const std::string& url, std::size_t n, Make make, ConsumeOrdering ordering,
                   KeyHolds* holds) {
  auto source = source_or_die(url);
  ConsumeLoopOptions options;
  options.workers = kWorkers;
  options.max_in_flight = kPrefetch;
  options.ordering = ordering;
  options.holds = holds;
  std::atomic<std::size_t> settled{0};
  std::atomic<bool> started{false};
  Steady::time_point t0{};
  double cpu0 = 0;
  std::mutex m;
  options.on_outcome = [&](const Delivery&, std::string_view outcome, std::string_view) {
    if (outcome.starts_with("retry")) return;
    if (!started.exchange(true)) {
      const std::lock_guard lock(m);
      t0 = Steady::now();
      cpu0 = cpu_seconds();
    }
    ++settled;
  };
  std::unique_ptr<ConsumeLoop> loop = make(*source, options);
  std::thread runner([&] {
    if (auto r = loop->run(); !r) die(r.error().message);
  });
  while (settled.load() < n) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  {
    const std::lock_guard lock(m);
    report(mode, n, t0, cpu0);
  }
  loop->stop();
  runner.join();
  return 0;
}

int loop_until(const char* mode, const std::string& url, std::size_t n, DeliveryProcessor processor,
               ConsumeOrdering ordering = ConsumeOrdering::none, KeyHolds* holds = nullptr) {
  return run_loop_until(mode, url, n, [&](MessageSource& source, ConsumeLoopOptions options) {
    return std::make_unique<ConsumeLoop>(source, std::move(processor), std::move(options));
  }, ordering, holds);
}

// The batched form with a no-op effect.
int loop_until(const char* mode, const std::string& url, std::size_t n, Consumer& consumer, ConsumeOrdering ordering,
               KeyHolds* holds) {
  return run_loop_until(mode, url, n, [&](MessageSource& source, ConsumeLoopOptions options) {
    return std::make_unique<ConsumeLoop>(source, consumer, [](const Delivery&, const DeliveryAttempt&) -> std::expected<std::string, MessageDisposition> {
      return "ok";
    }, std::move(options));
  }, ordering, holds);
}

int inprocess(const std::string& url, std::size_t n, const std::string& store_url, const std::string& ordering) {
  auto opened = open_store(store_url, {});
  if (!opened) die(opened.error().message);
  auto consumer = Consumer::create(*opened->store, {.name = "bench"});
  if (!consumer) die(consumer.error());
  StoreKeyHolds holds(*opened->store, "bench");
  if (ordering == "single") {
    return loop_until("inprocess-single", url, n, [&](const Delivery& d, const DeliveryAttempt&) {
      return disposition_of(consumer->process_once(d.message_id, d.body, [] { return std::expected<std::string, std::string>("ok"); }));
    });
  }
  return loop_until("inprocess", url, n, *consumer, ordering.starts_with("key") ? ConsumeOrdering::key : ConsumeOrdering::none,
                    ordering == "key" ? &holds : nullptr);
}

int raw_http(const std::string& url, std::size_t n, const std::string& handler) {
  client::CurlTransport transport{client::CurlOptions{}};
  return loop_until("raw-http", url, n, [&](const Delivery& d, const DeliveryAttempt&) {
    client::HttpRequest request;
    request.url = handler;
    request.body = d.body;
    request.headers = {{"Idempotency-Key", d.message_id}, {"Content-Type", "application/json"}};
    auto r = transport.perform(request, std::chrono::seconds(10));
    if (!r || r->status >= 300) return MessageDisposition::retry_it("handler", "failed", true);
    return MessageDisposition::ack_it("processed");
  });
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: see the header of bench/consumers/consume_bench.cpp\n");
    return 2;
  }
  const std::string mode = argv[1], url = argv[2];
  const std::size_t n = std::strtoull(argv[3], nullptr, 10);
  if (mode == "publish") {
    return publish(url, n, argc > 4 ? std::strtoull(argv[4], nullptr, 10) : 100, "publish",
                   argc > 5 ? std::strtoull(argv[5], nullptr, 10) : 0);
  }
  if (mode == "outbox-raw") return publish(url, n, 300, "outbox-raw");
  if (mode == "raw") return raw(url, n);
  if (mode == "inprocess" && argc > 4) {
    return inprocess(url, n, argv[4], argc > 5 ? argv[5] : "none");
  }
  if (mode == "raw-http" && argc > 4) return raw_http(url, n, argv[4]);
  std::fprintf(stderr, "idem-consume-bench: unknown mode or missing argument\n");
  return 2;
}
