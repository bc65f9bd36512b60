// idem-broker-tool: what the end-to-end tests (tests/consume, tests/outbox) need of a broker, by URL.
//
//   idem-broker-tool publish SINK_URL       messages from stdin, one JSON object a line:
//                                           {"id": "m-1", "body": "...", "content_type": "...",
//                                            "headers": {"k": "v"}, "destination": "...",
//                                            "ordering_key": "..."}
//                                           ("id": null publishes a message without an id; a
//                                           "body_bytes": N fills the body with N 'x's). Prints
//                                           the count published; every message confirmed.
//   idem-broker-tool take SOURCE_URL        receives (and acks) every message there is, until none
//          [--idle-ms N] [--claim-idle-ms N] came for --idle-ms (default 1000); one JSON object a
//                                           line on stdout: id, body (or body_bytes when longer
//                                           than 1 KiB), content_type, ordering_key, headers,
//                                           redelivered, delivery_count.
//
// Exit codes: 0 done, 1 a broker error (said on stderr), 2 bad usage or input.
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "idem/open_broker.hpp"
#include "idem/redact.hpp"

namespace {

using namespace idem;
using json = nlohmann::json;

int usage() {
  std::fprintf(stderr,
               "usage: idem-broker-tool publish SINK_URL < messages.jsonl\n"
               "       idem-broker-tool take SOURCE_URL [--idle-ms N] [--claim-idle-ms N]\n");
  return 2;
}

int publish(const std::string& url) {
  auto sink = open_sink(url, {});
  if (!sink) {
    std::fprintf(stderr, "idem-broker-tool: %s\n", sink.error().message.c_str());
    return 1;
  }
  std::vector<OutgoingMessage> batch;
  std::size_t published = 0;
  auto flush = [&]() -> bool {
    for (int round = 0; !batch.empty(); ++round) {
      if (round == 100) {
        std::fprintf(stderr, "idem-broker-tool: the broker kept refusing a publish\n");
        return false;
      }
      auto results = (*sink)->publish(batch);
      std::vector<OutgoingMessage> again;
      for (std::size_t i = 0; i < batch.size(); ++i) {
        if (results[i]) {
          ++published;
        } else if (results[i].error().retryable()) {
          again.push_back(std::move(batch[i]));  // at least once: consumers dedupe
        } else {
          std::fprintf(stderr, "idem-broker-tool: message %s: %s\n", batch[i].message_id.c_str(),
                       results[i].error().message.c_str());
          return false;
        }
      }
      if (!again.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(200));
      batch = std::move(again);
    }
    return true;
  };
  std::string line;
  while (std::getline(std::cin, line)) {
    if (line.empty()) continue;
    const json j = json::parse(line, nullptr, false);
    if (!j.is_object()) {
      std::fprintf(stderr, "idem-broker-tool: not a JSON object: %s\n", line.c_str());
      return 2;
    }
    OutgoingMessage m;
    if (j.contains("id") && j["id"].is_string()) m.message_id = j["id"].get<std::string>();
    m.content_type = j.value("content_type", std::string("application/json"));
    m.body = j.value("body", std::string());
    if (j.contains("body_bytes")) m.body.assign(j["body_bytes"].get<std::size_t>(), 'x');
    m.destination = j.value("destination", std::string());
    m.ordering_key = j.value("ordering_key", std::string());
    if (j.contains("headers")) {
      for (const auto& [k, v] : j["headers"].items()) m.headers.emplace_back(k, v.get<std::string>());
    }
    batch.push_back(std::move(m));
    if (batch.size() >= 500 && !flush()) return 1;
  }
  if (!flush()) return 1;
  std::printf("%zu\n", published);
  return 0;
}

int take(const std::string& url, long idle_ms, long claim_idle_ms) {
  SourceSettings settings;
  settings.consumer = "idem-broker-tool";
  settings.claim_idle = std::chrono::milliseconds(claim_idle_ms);
  settings.prefetch = 500;
  auto source = open_source(url, settings);
  if (!source) {
    std::fprintf(stderr, "idem-broker-tool: %s\n", source.error().message.c_str());
    return 1;
  }
  auto last = std::chrono::steady_clock::now();
  while (std::chrono::steady_clock::now() - last < std::chrono::milliseconds(idle_ms)) {
    auto got = (*source)->receive(500, std::chrono::milliseconds(100));
    if (!got) {
      std::fprintf(stderr, "idem-broker-tool: %s\n", got.error().message.c_str());
      return 1;
    }
    if (got->empty()) continue;
    last = std::chrono::steady_clock::now();
    for (const Delivery& d : *got) {
      json j;
      j["id"] = d.has_message_id ? json(d.message_id) : json(nullptr);
      if (d.body.size() > 1024) {
        j["body_bytes"] = d.body.size();
      } else {
        j["body"] = d.body;
      }
      j["content_type"] = d.content_type;
      j["ordering_key"] = d.ordering_key.empty() ? json(nullptr) : json(d.ordering_key);
      json headers = json::object();
      for (const auto& [k, v] : d.headers) headers[k] = v;
      j["headers"] = headers;
      j["redelivered"] = d.redelivered;
      j["delivery_count"] = d.delivery_count;
      std::cout << j.dump(-1, ' ', false, json::error_handler_t::replace) << "\n";
    }
    if (auto acked = (*source)->ack(*got); !acked) {
      std::fprintf(stderr, "idem-broker-tool: ack: %s\n", acked.error().message.c_str());
      return 1;
    }
  }
  std::cout.flush();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) return usage();
  const std::string command = argv[1];
  const std::string url = argv[2];
  if (command == "publish" && argc == 3) return publish(url);
  if (command == "take") {
    long idle_ms = 1000, claim_idle_ms = 100;
    for (int i = 3; i + 1 < argc; i += 2) {
      const std::string flag = argv[i];
      if (flag == "--idle-ms") {
        idle_ms = std::stol(argv[i + 1]);
      } else if (flag == "--claim-idle-ms") {
        claim_idle_ms = std::stol(argv[i + 1]);
      } else {
        return usage();
      }
    }
    if ((argc - 3) % 2 != 0) return usage();
    return take(url, idle_ms, claim_idle_ms);
  }
  return usage();
}
