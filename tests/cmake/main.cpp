// A user's program against the installed library: one execution, then a replay; one message
// processed, then recognised.
#include <idem/consumer.hpp>
#include <idem/engine.hpp>
#include <idem/jcs.hpp>
#include <idem/memory_store.hpp>
#include <idem/sqlite_consumer.hpp>
#include <idem/sqlite_store.hpp>
#include <idem/client/key.hpp>

#include <cstdio>
#include <vector>

int main() {
  idem::MemoryStore store;
  idem::Engine engine(store);
  idem::Policy policy;
  std::vector<idem::HeaderView> headers{{"Idempotency-Key", "consumer-key-0000001"}};
  idem::RequestView request{"POST", "/v1/things", "", headers, "{\"b\":1,\"a\":2}"};

  auto first = engine.begin_and_wait(policy, request, "tenant");
  if (first.verdict != idem::Verdict::execute) return 1;
  if (!engine.finish_and_wait(*first.ticket, {201, {}, "created"})) return 1;
  auto second = engine.begin_and_wait(policy, request, "tenant");
  if (second.verdict != idem::Verdict::replay || second.replay->body != "created") return 1;
  if (idem::canonicalize_json("{\"b\":1,\"a\":2}").value_or("") != "{\"a\":2,\"b\":1}") return 1;
  if (idem::client::new_key().value_or("").size() != 36) return 1;

  auto consumer = idem::Consumer::create(store, {.name = "emails"});
  if (!consumer) return 1;
  auto handler = []() -> std::expected<std::string, std::string> { return "sent"; };
  auto processed = consumer->process_once("message-1", "payload", handler);
  auto duplicate = consumer->process_once("message-1", "payload", handler);
  if (!processed || processed->status != idem::MessageStatus::processed) return 1;
  if (!duplicate || duplicate->status != idem::MessageStatus::duplicate || duplicate->result != "sent") return 1;
  std::puts("idem consumer: find_package(idem) works");
  return 0;
}
