// A user's program against the installed library: one execution, then a replay.
#include <idem/engine.hpp>
#include <idem/jcs.hpp>
#include <idem/memory_store.hpp>
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
  std::puts("idem consumer: find_package(idem) works");
  return 0;
}
