#include "idem/redis_store.hpp"

#include <algorithm>
#include <atomic>
#include <charconv>
#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "idem/headers_codec.hpp"
#include "idem/store_batch.hpp"
#include "record_codec.hpp"
#include "router.hpp"
#include "scripts.hpp"
#include "slot.hpp"
#include "idem/redis_wire/url.hpp"

namespace idem {

using redis_detail::Address;
using redis_detail::Failure;
using redis_detail::Op;
using redis_detail::Reply;
using redis_detail::ReplyCallback;
using redis_detail::ScriptId;
using redis_detail::Steady;
using redis_detail::ms_text;

namespace {

StoreError internal_error(std::string message) { return StoreError{StoreErrc::internal, std::move(message), false}; }

StoreError bad_reply(std::string_view what, const Reply& reply) {
  std::string text = reply.is_text() || reply.is_error() ? reply.str.substr(0, 80) : "";
  return internal_error("redis: unexpected reply to " + std::string(what) + (text.empty() ? "" : ": " + text));
}

// The physical TTL: the record's logical lifetime plus the grace (never below one millisecond).
std::string ttl_text(TimePoint now, TimePoint expires, Millis grace) {
  const auto lifetime = std::max<std::int64_t>(to_epoch_ms(expires) - to_epoch_ms(now), 0);
  return std::to_string(std::max<std::int64_t>(lifetime + grace.count(), 1));
}

StoreResult<FenceStatus> fence_status(const Reply& reply, std::string_view what) {
  if (reply.type != Reply::Type::integer || (reply.integer != 0 && reply.integer != 1)) {
    return std::unexpected(bad_reply(what, reply));
  }
  return reply.integer == 1 ? FenceStatus::ok : FenceStatus::lost;
}

StoreResult<AdminStatus> admin_status(const Reply& reply, std::string_view what) {
  if (reply.is_text()) {
    if (reply.str == "done") return AdminStatus::done;
    if (reply.str == "not_found") return AdminStatus::not_found;
    if (reply.str == "wrong_state") return AdminStatus::wrong_state;
  }
  return std::unexpected(bad_reply(what, reply));
}

std::optional<ClaimStatus> parse_claim_status(std::string_view s) {
  if (s == "claimed") return ClaimStatus::claimed;
  if (s == "mismatch") return ClaimStatus::mismatch;
  if (s == "completed") return ClaimStatus::completed;
  if (s == "in_progress") return ClaimStatus::in_progress;
  if (s == "outcome_unknown") return ClaimStatus::outcome_unknown;
  return std::nullopt;
}

std::optional<ClaimKind> parse_claim_kind(std::string_view s) {
  if (s == "fresh") return ClaimKind::fresh;
  if (s == "after_lease_expiry") return ClaimKind::after_lease_expiry;
  if (s == "after_failure") return ClaimKind::after_failure;
  return std::nullopt;
}

// Whether `text` is all of a decimal number that fits `out`.
template <class Int>
bool parse_decimal(const std::string& text, Int& out) {
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), out);
  return ec == std::errc{} && ptr == text.data() + text.size() && !text.empty();
}

// {'claimed', kind, created, attempt} or {status, '', the record}: see lua/claim.lua.
StoreResult<ClaimResult> decode_claim(const ClaimRequest& request, const Reply& reply) {
  if (!reply.is_array() || reply.elements.size() < 3 || !reply.elements[0].is_text()) {
    return std::unexpected(bad_reply("claim", reply));
  }
  auto status = parse_claim_status(reply.elements[0].str);
  if (!status) return std::unexpected(bad_reply("claim", reply));
  ClaimResult result;
  result.status = *status;
  if (*status == ClaimStatus::claimed) {
    auto kind = parse_claim_kind(reply.elements[1].str);
    std::int64_t created = 0;
    std::uint32_t attempt = 0;
    if (!kind || reply.elements.size() != 4 || !parse_decimal(reply.elements[2].str, created) ||
        !parse_decimal(reply.elements[3].str, attempt) || attempt == 0) {
      return std::unexpected(bad_reply("claim", reply));
    }
    result.kind = *kind;
    result.record = claimed_record(request, std::nullopt);
    result.record.created = from_epoch_ms(created);
    result.record.attempt = attempt;
    return result;
  }
  if (reply.elements[2].type != Reply::Type::string) return std::unexpected(bad_reply("claim", reply));
  auto record = redis_detail::decode_record(request.id, reply.elements[2].str);
  if (!record) return std::unexpected(record.error());
  result.record = std::move(*record);
  return result;
}

// A record read by GET (a string) or, for a legacy record, by HGETALL (an array); nullopt when
// the key is gone.
StoreResult<std::optional<Record>> decode_either(const RecordId& id, const Reply& reply) {
  if (reply.type == Reply::Type::nil) return std::optional<Record>{};
  if (reply.is_array()) return redis_detail::decode_legacy_record(id, reply);
  if (reply.type != Reply::Type::string) return std::unexpected(bad_reply("GET", reply));
  auto record = redis_detail::decode_record(id, reply.str);
  if (!record) return std::unexpected(record.error());
  return std::optional<Record>{std::move(*record)};
}

bool is_wrongtype(const Reply& reply) { return reply.is_error() && reply.str.starts_with("WRONGTYPE"); }

// An error reply a raw_errors Op received, as the store reports it.
StoreError reply_error(const Reply& reply) {
  return redis_detail::map_error(Failure{Failure::Kind::reply, reply.str, ""});
}

// One thread for the calls that take many round trips (SCAN-based), so they never hold up a
// node's thread or the caller.
class JobThread {
 public:
  JobThread() : thread_([this] { run(); }) {}
  ~JobThread() {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    cv_.notify_one();
    thread_.join();
  }
  void post(std::move_only_function<void()> job) {
    {
      std::lock_guard lock(mutex_);
      jobs_.push_back(std::move(job));
    }
    cv_.notify_one();
  }

 private:
  void run() {
    std::unique_lock lock(mutex_);
    while (true) {
      cv_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
      if (jobs_.empty()) return;  // stop_ and nothing left
      auto job = std::move(jobs_.front());
      jobs_.pop_front();
      lock.unlock();
      job();
      lock.lock();
    }
  }
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::move_only_function<void()>> jobs_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace

class RedisStore::Impl {
 public:
  Impl(RedisOptions opts, redis_detail::RedisUrl url, redis_detail::Settings settings)
      : options(std::move(opts)),
        router(std::move(url), std::move(settings), counters, options.topology_refresh_interval) {}

  ~Impl() {
    admin.reset();     // finishes its jobs, which still need the router
    router.shutdown();
  }

  Op make_op(std::vector<std::string> args, ReplyCallback done) {
    Op op;
    op.args = std::move(args);
    op.deadline = Steady::now() + options.command_timeout;
    op.done = std::move(done);
    return op;
  }

  // Runs a script on the record at `key`.
  Op script_op(ScriptId id, const std::string& key, std::vector<std::string> argv, bool write, ReplyCallback done) {
    const auto& s = redis_detail::script(id);
    std::vector<std::string> args;
    args.reserve(argv.size() + 4);
    args.emplace_back("EVALSHA");
    args.push_back(s.sha1);
    args.emplace_back("1");
    args.push_back(key);
    for (auto& a : argv) args.push_back(std::move(a));
    Op op = make_op(std::move(args), std::move(done));
    op.slot = redis_detail::key_slot(key);
    op.script = &s;
    op.write = write;
    return op;
  }

  void eval(ScriptId id, const std::string& key, std::vector<std::string> argv, bool write, ReplyCallback done) {
    router.dispatch(script_op(id, key, std::move(argv), write, std::move(done)));
  }

  // A claim by the script, which decides every case atomically on the server.
  Op claim_script_op(ClaimRequest request, Callback<ClaimResult> done) {
    const std::string key = redis_detail::record_key(options.key_prefix, request.id);
    std::vector<std::string> argv{ms_text(request.now),
                                  request.request_hash,
                                  std::to_string(request.token),
                                  ms_text(request.lease_expires),
                                  ms_text(request.expires),
                                  request.take_over_expired_lease ? "1" : "0",
                                  ttl_text(request.now, request.expires, options.ttl_grace),
                                  request.lookup};
    return script_op(ScriptId::claim, key, std::move(argv), true,
                     [request = std::move(request), done = std::move(done)](StoreResult<Reply> reply) mutable {
                       if (!reply) return done(std::unexpected(std::move(reply.error())));
                       done(decode_claim(request, *reply));
                     });
  }

  void claim_by_script(ClaimRequest request, Callback<ClaimResult> done) {
    router.dispatch(claim_script_op(std::move(request), std::move(done)));
  }

  // A claim: `SET NX GET` first (Redis 7.0 and later), the script when that is not enough, or
  // at once when `by_script`.
  Op claim_op(ClaimRequest request, Callback<ClaimResult> done, bool by_script) {
    if (by_script || !set_nx_get.load(std::memory_order_relaxed)) {
      return claim_script_op(std::move(request), std::move(done));
    }
    // A fresh key, the common case, is claimed without Lua: SET NX writes the new record unless one
    // is there, and GET hands that one back. decide_claim then says whether it answers the claim
    // (replay, conflict, in progress) or may be taken over, which only the script does atomically.
    const std::string key = redis_detail::record_key(options.key_prefix, request.id);
    Record fresh = claimed_record(request, std::nullopt);
    std::vector<std::string> args{"SET", key, redis_detail::encode_record(fresh), "NX", "GET", "PX",
                                  ttl_text(request.now, request.expires, options.ttl_grace)};
    Op op = make_op(
        std::move(args),
        [this, request = std::move(request), fresh = std::move(fresh),
         done = std::move(done)](StoreResult<Reply> reply) mutable {
          if (!reply) return done(std::unexpected(std::move(reply.error())));
          if (reply->type == Reply::Type::nil) {
            return done(ClaimResult{ClaimStatus::claimed, ClaimKind::fresh, std::move(fresh)});
          }
          if (reply->is_error()) {
            // WRONGTYPE: a record an earlier idem wrote as a hash, which the script converts. A
            // syntax error: a Redis before 7.0, which has no SET NX GET; the script serves it.
            if (reply->str.starts_with("ERR syntax")) {
              set_nx_get.store(false, std::memory_order_relaxed);
            } else if (!is_wrongtype(*reply)) {
              return done(std::unexpected(reply_error(*reply)));
            }
            return claim_by_script(std::move(request), std::move(done));
          }
          if (reply->type != Reply::Type::string) return done(std::unexpected(bad_reply("claim", *reply)));
          auto decoded = redis_detail::decode_record(request.id, reply->str);
          if (!decoded) return done(std::unexpected(std::move(decoded.error())));
          std::optional<Record> current(std::move(*decoded));
          const ClaimDecision decision = decide_claim(current, request);
          if (decision.status == ClaimStatus::claimed) return claim_by_script(std::move(request), std::move(done));
          done(ClaimResult{decision.status, ClaimKind::fresh, std::move(*current)});
        });
    op.slot = redis_detail::key_slot(key);
    op.write = true;
    op.raw_errors = true;
    return op;
  }

  // A fenced write by `id`'s script: ok or lost.
  Op fenced_op(ScriptId id, const RecordId& record, std::vector<std::string> argv, const char* what,
               Callback<FenceStatus> done) {
    return script_op(id, redis_detail::record_key(options.key_prefix, record), std::move(argv), true,
                     [what, done = std::move(done)](StoreResult<Reply> reply) mutable {
                       if (!reply) return done(std::unexpected(std::move(reply.error())));
                       done(fence_status(*reply, what));
                     });
  }

  Op complete_op(CompleteRequest request, Callback<FenceStatus> done) {
    std::vector<std::string> argv{std::to_string(request.fence.token),
                                  ms_text(request.now),
                                  ms_text(request.expires),
                                  ttl_text(request.now, request.expires, options.ttl_grace),
                                  std::to_string(request.response.status),
                                  encode_headers(request.response.headers),
                                  std::move(request.response.body)};
    return fenced_op(ScriptId::complete, request.fence.id, std::move(argv), "complete", std::move(done));
  }

  Op fail_op(FailRequest request, Callback<FenceStatus> done) {
    std::vector<std::string> argv{std::to_string(request.fence.token), ms_text(request.expires),
                                  ttl_text(request.now, request.expires, options.ttl_grace)};
    return fenced_op(ScriptId::fail, request.fence.id, std::move(argv), "fail", std::move(done));
  }

  Op release_op(const Fence& fence, Callback<FenceStatus> done) {
    return fenced_op(ScriptId::release, fence.id, {std::to_string(fence.token)}, "release", std::move(done));
  }

  // A batch call: one command per item, each answering into its place, handed to the router
  // together so that each node writes its share in one go. `make(item, index, callback)`.
  template <class T, class Item, class Make>
  void dispatch_batch(std::vector<Item> items, BatchCallback<T> done, Make&& make) {
    auto collector = BatchCollector<T>::make(items.size(), std::move(done));
    std::vector<Op> ops;
    ops.reserve(items.size());
    for (std::size_t i = 0; i < items.size(); ++i) {
      ops.push_back(make(std::move(items[i]), i, BatchCollector<T>::slot(collector, i)));
    }
    router.dispatch_many(std::move(ops));
  }

  // A record an earlier idem stored as a hash, read as it is (only scripts rewrite it).
  void get_legacy(const std::string& key, RecordId id, Callback<std::optional<Record>> done) {
    Op op = make_op({"HGETALL", key}, [id = std::move(id), done = std::move(done)](StoreResult<Reply> reply) mutable {
      if (!reply) return done(std::unexpected(std::move(reply.error())));
      done(decode_either(id, *reply));
    });
    op.slot = redis_detail::key_slot(key);
    router.dispatch(std::move(op));
  }

  // ---- blocking helpers, for the admin thread only ----

  std::vector<StoreResult<Reply>> call_all(std::vector<Op> ops) {
    std::vector<std::promise<StoreResult<Reply>>> promises(ops.size());
    std::vector<std::future<StoreResult<Reply>>> futures;
    futures.reserve(ops.size());
    for (std::size_t i = 0; i < ops.size(); ++i) {
      futures.push_back(promises[i].get_future());
      ops[i].done = [p = &promises[i]](StoreResult<Reply> r) { p->set_value(std::move(r)); };
    }
    for (auto& op : ops) router.dispatch(std::move(op));
    std::vector<StoreResult<Reply>> out;
    out.reserve(futures.size());
    for (auto& f : futures) out.push_back(f.get());
    return out;
  }

  StoreResult<Reply> call_on(const Address& node, std::vector<std::string> args) {
    Op op = make_op(std::move(args), nullptr);
    op.node = node;
    std::vector<Op> ops;
    ops.push_back(std::move(op));
    return std::move(call_all(std::move(ops)).front());
  }

  StoreResult<std::vector<Address>> masters() {
    auto m = router.masters();
    if (m.empty()) {
      router.request_refresh();
      return std::unexpected(StoreError{StoreErrc::unavailable, "redis cluster: slot map unknown", false});
    }
    return m;
  }

  // SCANs every record key on every master; `batch` sees each SCAN page and returns false to
  // stop early.
  template <class Batch>
  StoreResult<Done> scan(Batch&& batch) {
    auto nodes = masters();
    if (!nodes) return std::unexpected(nodes.error());
    const std::string pattern = redis_detail::scan_pattern(options.key_prefix);
    const std::string count = std::to_string(options.scan_count);
    for (const auto& node : *nodes) {
      std::string cursor = "0";
      do {
        auto page = call_on(node, {"SCAN", cursor, "MATCH", pattern, "COUNT", count});
        if (!page) return std::unexpected(page.error());
        if (!page->is_array() || page->elements.size() != 2 || !page->elements[1].is_array()) {
          return std::unexpected(bad_reply("SCAN", *page));
        }
        cursor = page->elements[0].str;
        std::vector<std::string> keys;
        for (auto& k : page->elements[1].elements) keys.push_back(std::move(k.str));
        auto more = batch(std::move(keys));
        if (!more) return std::unexpected(more.error());
        if (!*more) return Done{};
      } while (cursor != "0");
    }
    return Done{};
  }

  // One command per key, pipelined; the replies in key order.
  // `raw_errors`: error replies come back as replies (see Op::raw_errors).
  std::vector<StoreResult<Reply>> per_key(const std::vector<std::string>& keys,
                                          const std::function<std::vector<std::string>(const std::string&)>& args,
                                          bool raw_errors = false) {
    std::vector<Op> ops;
    ops.reserve(keys.size());
    for (const auto& k : keys) {
      Op op = make_op(args(k), nullptr);
      op.slot = redis_detail::key_slot(k);
      op.raw_errors = raw_errors;
      ops.push_back(std::move(op));
    }
    return call_all(std::move(ops));
  }

  // Reads `keys` with `read`; the keys holding a legacy hash record are read again with
  // `read_legacy`. The replies in key order (nil where a key is gone).
  std::vector<StoreResult<Reply>> per_key_either(
      const std::vector<std::string>& keys, const std::function<std::vector<std::string>(const std::string&)>& read,
      const std::function<std::vector<std::string>(const std::string&)>& read_legacy) {
    auto replies = per_key(keys, read, /*raw_errors=*/true);
    std::vector<std::string> legacy_keys;
    std::vector<std::size_t> legacy_at;
    for (std::size_t i = 0; i < replies.size(); ++i) {
      if (!replies[i] || !replies[i]->is_error()) continue;
      if (!is_wrongtype(*replies[i])) {
        replies[i] = std::unexpected(reply_error(*replies[i]));
        continue;
      }
      legacy_keys.push_back(keys[i]);
      legacy_at.push_back(i);
    }
    if (legacy_keys.empty()) return replies;
    auto legacy = per_key(legacy_keys, read_legacy);
    for (std::size_t j = 0; j < legacy.size(); ++j) replies[legacy_at[j]] = std::move(legacy[j]);
    return replies;
  }

  // The state and expiry of each key's record (nullopt: gone meanwhile, or not a record),
  // without reading responses.
  StoreResult<std::vector<std::optional<redis_detail::RecordHead>>> heads(const std::vector<std::string>& keys) {
    auto replies = per_key_either(
        keys,
        [](const std::string& k) {
          return std::vector<std::string>{"GETRANGE", k, "0", std::to_string(redis_detail::kHeadBytes - 1)};
        },
        [](const std::string& k) { return std::vector<std::string>{"HMGET", k, "state", "expires"}; });
    std::vector<std::optional<redis_detail::RecordHead>> out;
    out.reserve(replies.size());
    for (auto& r : replies) {
      if (!r) return std::unexpected(r.error());
      std::optional<redis_detail::RecordHead> head;
      if (r->type == Reply::Type::string) {
        head = redis_detail::parse_record_head(r->str);
      } else if (r->is_array() && r->elements.size() == 2 && r->elements[0].type == Reply::Type::string) {
        auto state = parse_record_state(r->elements[0].str);  // legacy: HMGET state expires
        std::int64_t expires = 0;
        const auto& text = r->elements[1].str;
        auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), expires);
        if (state && ec == std::errc{} && ptr == text.data() + text.size() && !text.empty()) {
          head = redis_detail::RecordHead{*state, expires};
        }
      }
      out.push_back(head);
    }
    return out;
  }

  StoreResult<std::size_t> purge(TimePoint now, std::size_t limit) {
    std::size_t purged = 0;
    if (limit == 0) return purged;
    const auto now_ms = to_epoch_ms(now);
    auto scanned = scan([&](std::vector<std::string> keys) -> StoreResult<bool> {
      auto found = heads(keys);
      if (!found) return std::unexpected(found.error());
      std::vector<Op> deletes;
      for (std::size_t i = 0; i < keys.size() && purged + deletes.size() < limit; ++i) {
        const auto& head = (*found)[i];
        if (!head || head->expires_ms > now_ms) continue;  // gone meanwhile, or not yet expired
        deletes.push_back(script_op(ScriptId::purge, keys[i], {std::to_string(now_ms)}, true, nullptr));
      }
      for (auto& r : call_all(std::move(deletes))) {
        if (!r) return std::unexpected(r.error());
        if (r->type == Reply::Type::integer && r->integer == 1) ++purged;
      }
      return purged < limit;
    });
    if (!scanned) return std::unexpected(scanned.error());
    return purged;
  }

  StoreResult<StateCounts> count(TimePoint now) {
    StateCounts counts;
    const auto now_ms = to_epoch_ms(now);
    auto scanned = scan([&](std::vector<std::string> keys) -> StoreResult<bool> {
      auto found = heads(keys);
      if (!found) return std::unexpected(found.error());
      for (const auto& head : *found) {
        if (!head) continue;
        if (head->expires_ms <= now_ms) {
          ++counts.expired;
          continue;
        }
        switch (head->state) {
          case RecordState::in_progress: ++counts.in_progress; break;
          case RecordState::completed: ++counts.completed; break;
          case RecordState::failed_retryable: ++counts.failed_retryable; break;
        }
      }
      return true;
    });
    if (!scanned) return std::unexpected(scanned.error());
    return counts;
  }

  StoreResult<std::vector<Record>> list(const ListQuery& query) {
    std::vector<std::pair<RecordId, std::string>> ids;  // identity, Redis key
    auto scanned = scan([&](std::vector<std::string> keys) -> StoreResult<bool> {
      for (auto& k : keys) {
        auto id = redis_detail::parse_record_key(options.key_prefix, k);
        if (!id) continue;  // not ours
        if (query.after && std::tie(id->tenant, id->key) <= std::tie(query.after->tenant, query.after->key)) continue;
        if (query.tenant && id->tenant != *query.tenant) continue;
        ids.emplace_back(std::move(*id), std::move(k));
      }
      return true;
    });
    if (!scanned) return std::unexpected(scanned.error());
    auto less = [](const auto& a, const auto& b) {
      return std::tie(a.first.tenant, a.first.key) < std::tie(b.first.tenant, b.first.key);
    };
    std::sort(ids.begin(), ids.end(), less);
    ids.erase(std::unique(ids.begin(), ids.end(), [](const auto& a, const auto& b) { return a.second == b.second; }),
              ids.end());
    std::vector<Record> out;
    const std::size_t chunk = std::max<std::size_t>(query.limit, 64);
    for (std::size_t at = 0; at < ids.size() && out.size() < query.limit; at += chunk) {
      const std::size_t end = std::min(ids.size(), at + chunk);
      std::vector<std::string> keys;
      for (std::size_t i = at; i < end; ++i) keys.push_back(ids[i].second);
      auto replies = per_key_either(
          keys, [](const std::string& k) { return std::vector<std::string>{"GET", k}; },
          [](const std::string& k) { return std::vector<std::string>{"HGETALL", k}; });
      for (std::size_t i = 0; i < replies.size() && out.size() < query.limit; ++i) {
        if (!replies[i]) return std::unexpected(replies[i].error());
        auto record = decode_either(ids[at + i].first, *replies[i]);
        if (!record) return std::unexpected(record.error());
        if (!*record) continue;  // expired meanwhile
        if (query.state && (*record)->state != *query.state) continue;
        out.push_back(std::move(**record));
      }
    }
    return out;
  }

  RedisOptions options;
  // Whether claims try `SET NX GET` first (Redis 7.0 and later); cleared when the server
  // refuses its syntax.
  std::atomic<bool> set_nx_get{true};
  redis_detail::Counters counters;
  redis_detail::Router router;
  std::unique_ptr<JobThread> admin = std::make_unique<JobThread>();
};

StoreResult<std::unique_ptr<RedisStore>> RedisStore::open(RedisOptions options) {
  auto url = redis_detail::parse_redis_url(options.url);
  if (!url) return std::unexpected(internal_error("redis url: " + url.error()));
  auto invalid = [](std::string what) { return std::unexpected(internal_error("redis options: " + std::move(what))); };
  if (options.key_prefix.find_first_of("{}") != std::string::npos) return invalid("key_prefix must not contain { or }");
  if (options.connect_timeout.count() <= 0 || options.command_timeout.count() <= 0) {
    return invalid("timeouts must be positive");
  }
  if (options.reconnect_backoff_min.count() <= 0 || options.reconnect_backoff_max < options.reconnect_backoff_min) {
    return invalid("need 0 < reconnect_backoff_min <= reconnect_backoff_max");
  }
  if (options.max_retries < 0 || options.max_redirects < 0 || options.retry_delay.count() < 0) {
    return invalid("max_retries, max_redirects and retry_delay must not be negative");
  }
  if (options.ttl_grace.count() < 0) return invalid("ttl_grace must not be negative");
  if (options.wait_replicas < 0) return invalid("wait_replicas must not be negative");
  if (options.wait_replicas > 0 &&
      (options.wait_timeout.count() <= 0 || options.wait_timeout >= options.command_timeout)) {
    return invalid("wait_timeout must be positive and below command_timeout");
  }
  if (options.scan_count == 0) return invalid("scan_count must be positive");

  redis_detail::Settings settings;
  settings.connect.connect_timeout = options.connect_timeout;
  settings.connect.command_timeout = options.command_timeout;
  settings.connect.user = url->user;
  settings.connect.password = url->password;
  settings.connect.db = url->db;
  settings.command_timeout = options.command_timeout;
  settings.backoff_min = options.reconnect_backoff_min;
  settings.backoff_max = options.reconnect_backoff_max;
  settings.max_retries = options.max_retries;
  settings.retry_delay = options.retry_delay;
  settings.max_redirects = options.max_redirects;
  settings.wait_replicas = options.wait_replicas;
  settings.wait_timeout = options.wait_timeout;

  const bool check = options.check_on_open;
  auto impl = std::make_unique<Impl>(std::move(options), std::move(*url), std::move(settings));
  if (check) {
    if (auto started = impl->router.start(); !started) return std::unexpected(redis_detail::map_error(started.error()));
  } else {
    impl->router.request_refresh();
  }
  return std::unique_ptr<RedisStore>(new RedisStore(std::move(impl)));
}

RedisStore::RedisStore(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
RedisStore::~RedisStore() = default;

std::string RedisStore::redis_key(const RecordId& id) const {
  return redis_detail::record_key(impl_->options.key_prefix, id);
}

void RedisStore::claim(ClaimRequest request, Callback<ClaimResult> done) {
  impl_->router.dispatch(impl_->claim_op(std::move(request), std::move(done), /*by_script=*/false));
}

void RedisStore::complete(CompleteRequest request, Callback<FenceStatus> done) {
  impl_->router.dispatch(impl_->complete_op(std::move(request), std::move(done)));
}

void RedisStore::fail(FailRequest request, Callback<FenceStatus> done) {
  impl_->router.dispatch(impl_->fail_op(std::move(request), std::move(done)));
}

void RedisStore::release(Fence fence, Callback<FenceStatus> done) {
  impl_->router.dispatch(impl_->release_op(fence, std::move(done)));
}

void RedisStore::claim_many(std::vector<ClaimRequest> requests, BatchCallback<ClaimResult> done) {
  // A key that comes more than once is claimed by the script every time. With SET NX GET, a
  // claim that needs the script (a takeover) would run it a round trip later, after the key's
  // next claim had already been decided on the record before the takeover; scripts queued in
  // order on the key's node run in order, as single calls one after the other would.
  std::unordered_map<std::string, int> seen;
  std::vector<std::uint8_t> by_script(requests.size(), 0);
  for (const auto& r : requests) ++seen[redis_key(r.id)];
  for (std::size_t i = 0; i < requests.size(); ++i) by_script[i] = seen[redis_key(requests[i].id)] > 1;
  impl_->dispatch_batch<ClaimResult>(std::move(requests), std::move(done),
                                     [&](ClaimRequest r, std::size_t i, Callback<ClaimResult> cb) {
                                       return impl_->claim_op(std::move(r), std::move(cb), by_script[i] != 0);
                                     });
}

void RedisStore::complete_many(std::vector<CompleteRequest> requests, BatchCallback<FenceStatus> done) {
  impl_->dispatch_batch<FenceStatus>(std::move(requests), std::move(done),
                                     [&](CompleteRequest r, std::size_t, Callback<FenceStatus> cb) {
                                       return impl_->complete_op(std::move(r), std::move(cb));
                                     });
}

void RedisStore::fail_many(std::vector<FailRequest> requests, BatchCallback<FenceStatus> done) {
  impl_->dispatch_batch<FenceStatus>(std::move(requests), std::move(done),
                                     [&](FailRequest r, std::size_t, Callback<FenceStatus> cb) {
                                       return impl_->fail_op(std::move(r), std::move(cb));
                                     });
}

void RedisStore::release_many(std::vector<Fence> fences, BatchCallback<FenceStatus> done) {
  impl_->dispatch_batch<FenceStatus>(std::move(fences), std::move(done),
                                     [&](Fence f, std::size_t, Callback<FenceStatus> cb) {
                                       return impl_->release_op(f, std::move(cb));
                                     });
}

void RedisStore::abandon(AbandonRequest request, Callback<FenceStatus> done) {
  const std::string key = redis_key(request.fence.id);
  impl_->eval(ScriptId::abandon, key, {std::to_string(request.fence.token), ms_text(request.now)}, true,
              [done = std::move(done)](StoreResult<Reply> reply) mutable {
                if (!reply) return done(std::unexpected(std::move(reply.error())));
                done(fence_status(*reply, "abandon"));
              });
}

void RedisStore::get(RecordId id, Callback<std::optional<Record>> done) {
  const std::string key = redis_key(id);
  Op op = impl_->make_op({"GET", key}, [this, key, id = std::move(id), done = std::move(done)](
                                           StoreResult<Reply> reply) mutable {
    if (!reply) return done(std::unexpected(std::move(reply.error())));
    if (is_wrongtype(*reply)) return impl_->get_legacy(key, std::move(id), std::move(done));
    if (reply->is_error()) return done(std::unexpected(reply_error(*reply)));
    done(decode_either(id, *reply));
  });
  op.slot = redis_detail::key_slot(key);
  op.raw_errors = true;
  impl_->router.dispatch(std::move(op));
}

void RedisStore::purge_expired(TimePoint now, std::size_t limit, Callback<std::size_t> done) {
  impl_->admin->post([this, now, limit, done = std::move(done)]() mutable { done(impl_->purge(now, limit)); });
}

void RedisStore::ping(Callback<Done> done) {
  auto nodes = impl_->masters();
  if (!nodes) return done(std::unexpected(nodes.error()));
  // Every master must answer; the first error (or the last success) reports.
  struct Fanout {
    std::mutex mutex;
    std::size_t left;
    std::optional<StoreError> error;
    Callback<Done> done;
  };
  auto fanout = std::make_shared<Fanout>();
  fanout->left = nodes->size();
  fanout->done = std::move(done);
  for (const auto& node : *nodes) {
    Op op = impl_->make_op({"PING"}, [fanout](StoreResult<Reply> reply) {
      std::unique_lock lock(fanout->mutex);
      if (!reply && !fanout->error) fanout->error = reply.error();
      if (reply && !reply->is_text() && !fanout->error) fanout->error = bad_reply("PING", *reply);
      if (--fanout->left != 0) return;
      auto error = std::move(fanout->error);
      auto callback = std::move(fanout->done);
      lock.unlock();
      if (error) return callback(std::unexpected(std::move(*error)));
      callback(Done{});
    });
    op.node = node;
    impl_->router.dispatch(std::move(op));
  }
}

void RedisStore::list(ListQuery query, Callback<std::vector<Record>> done) {
  impl_->admin->post([this, query = std::move(query), done = std::move(done)]() mutable { done(impl_->list(query)); });
}

void RedisStore::mark_retryable(RecordId id, TimePoint now, Callback<AdminStatus> done) {
  const std::string key = redis_key(id);
  impl_->eval(ScriptId::mark_retryable, key, {ms_text(now), std::to_string(new_fencing_token())}, true,
              [done = std::move(done)](StoreResult<Reply> reply) mutable {
                if (!reply) return done(std::unexpected(std::move(reply.error())));
                done(admin_status(*reply, "mark_retryable"));
              });
}

void RedisStore::resolve(RecordId id, StoredResponse response, TimePoint now, TimePoint expires,
                         Callback<AdminStatus> done) {
  const std::string key = redis_key(id);
  std::vector<std::string> argv{ms_text(now),
                                std::to_string(new_fencing_token()),
                                ms_text(expires),
                                ttl_text(now, expires, impl_->options.ttl_grace),
                                std::to_string(response.status),
                                encode_headers(response.headers),
                                std::move(response.body)};
  impl_->eval(ScriptId::resolve, key, std::move(argv), true, [done = std::move(done)](StoreResult<Reply> reply) mutable {
    if (!reply) return done(std::unexpected(std::move(reply.error())));
    done(admin_status(*reply, "resolve"));
  });
}

void RedisStore::count(TimePoint now, Callback<StateCounts> done) {
  impl_->admin->post([this, now, done = std::move(done)]() mutable { done(impl_->count(now)); });
}

RedisStoreStats RedisStore::stats() const {
  const auto& c = impl_->counters;
  auto v = [](const std::atomic<std::uint64_t>& a) { return a.load(std::memory_order_relaxed); };
  RedisStoreStats s;
  s.commands = v(c.commands);
  s.replies = v(c.replies);
  s.batches = v(c.batches);
  s.largest_batch = v(c.largest_batch);
  s.moved = v(c.moved);
  s.ask = v(c.ask);
  s.retries = v(c.retries);
  s.noscript = v(c.noscript);
  s.connects = v(c.connects);
  s.connect_failures = v(c.connect_failures);
  s.connections_lost = v(c.connections_lost);
  s.timeouts = v(c.timeouts);
  s.topology_refreshes = v(c.topology_refreshes);
  return s;
}

}  // namespace idem
