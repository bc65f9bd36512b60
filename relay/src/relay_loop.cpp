#include "relay_loop.hpp"

#include <algorithm>
#include <random>

namespace idem::relay {
namespace {

using Steady = std::chrono::steady_clock;

constexpr auto kPurgeEvery = std::chrono::minutes(1);
constexpr std::size_t kPurgeBatch = 1000;
// How often the loop counts the outbox for /metrics (OutboxReader::count: the pending rows found
// from SQLite's scan mark or on PostgreSQL's pending index, the settled rows on their index).
constexpr auto kCountEvery = std::chrono::seconds(2);

OutgoingMessage outgoing(const OutboxRow& row) {
  OutgoingMessage m;
  m.message_id = row.message.message_id;
  m.destination = row.message.destination;
  m.content_type = row.message.content_type;
  m.headers = row.message.headers;
  m.body = row.message.body;
  m.ordering_key = row.message.ordering_key;
  return m;
}

}  // namespace

RelayLoop::RelayLoop(OutboxReader& outbox, MessageSink& sink, RelayOptions options)
    : outbox_(outbox), sink_(sink), options_(std::move(options)) {
  options_.batch = std::max<std::size_t>(options_.batch, 1);
  options_.max_attempts = std::max<std::uint32_t>(options_.max_attempts, 1);
}

void RelayLoop::stop() {
  stopping_.store(true);
  const std::lock_guard lock(mutex_);
  wake_.notify_all();
}

bool RelayLoop::pause(Millis d) {
  std::unique_lock lock(mutex_);
  wake_.wait_for(lock, d, [&] { return stopping_.load(); });
  return !stopping_.load();
}

Millis RelayLoop::backoff(std::uint32_t attempts) {
  thread_local std::minstd_rand random{std::random_device{}()};
  Millis base = options_.retry_min;
  for (std::uint32_t i = 1; i < attempts && base < options_.retry_max; ++i) base *= 2;
  base = std::min(base, options_.retry_max);
  std::uniform_int_distribution<std::int64_t> jitter(base.count() / 2, std::max<std::int64_t>(base.count(), 1));
  return Millis{jitter(random)};
}

void RelayLoop::purge_if_due(TimePoint now) {
  const auto steady = Steady::now();
  if (last_purge_ != Steady::time_point{} && steady - last_purge_ < kPurgeEvery) return;
  last_purge_ = steady;
  while (!stopping_.load()) {
    auto purged = outbox_.purge_sent(now - options_.retention, kPurgeBatch);
    if (!purged) {
      stats_.outbox_errors.fetch_add(1, std::memory_order_relaxed);
      if (options_.on_warning) options_.on_warning("outbox: purging sent rows failed: " + purged.error().message);
      return;
    }
    if (*purged < kPurgeBatch) return;
  }
}

void RelayLoop::count_if_due() {
  const auto steady = Steady::now();
  if (last_count_ != Steady::time_point{} && steady - last_count_ < kCountEvery) return;
  last_count_ = steady;
  auto counts = outbox_.count();
  if (!counts) {
    stats_.outbox_errors.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  stats_.pending.store(counts->pending);
  stats_.dead_rows.store(counts->dead);
  stats_.oldest_pending_ms.store(counts->oldest_pending ? to_epoch_ms(*counts->oldest_pending) : -1);
  stats_.held_keys.store(counts->held_keys);
  stats_.oldest_held_ms.store(counts->oldest_held ? to_epoch_ms(*counts->oldest_held) : -1);
}

Millis RelayLoop::round() {
  const TimePoint now = SystemClock::instance().now();
  purge_if_due(now);
  count_if_due();
  auto claimed = outbox_.claim(OutboxClaim{options_.batch, now, options_.lease, options_.owner, options_.dead_rows_pass});
  if (!claimed) {
    stats_.ready.store(false);
    stats_.outbox_errors.fetch_add(1, std::memory_order_relaxed);
    if (!outbox_trouble_told_ && options_.on_warning) options_.on_warning("outbox: " + claimed.error().message);
    outbox_trouble_told_ = true;
    return backoff(++outbox_failures_);
  }
  if (outbox_trouble_told_ && options_.on_warning) options_.on_warning("outbox: reachable again");
  outbox_trouble_told_ = false;
  outbox_failures_ = 0;
  const std::vector<OutboxRow>& rows = *claimed;
  if (rows.empty()) {
    stats_.ready.store(true);
    return options_.poll_interval;
  }

  std::vector<OutgoingMessage> messages;
  messages.reserve(rows.size());
  for (const OutboxRow& row : rows) messages.push_back(outgoing(row));
  const auto t0 = Steady::now();
  std::vector<BrokerResult<Done>> published = sink_.publish(messages);
  stats_.publish_latency.observe(Steady::now() - t0);
  published.resize(rows.size(), std::unexpected(BrokerError{BrokerErrc::internal, "the sink gave no result", false}));

  // The first row that failed and may go later decides the pause; it and every later row wait.
  std::optional<std::size_t> first_failed;
  for (std::size_t i = 0; i < rows.size(); ++i) {
    if (!published[i] && published[i].error().code != BrokerErrc::rejected &&
        published[i].error().code != BrokerErrc::invalid) {
      first_failed = i;
      break;
    }
  }
  // Whether that failure was about the row, not the sink being away: only then it counts toward
  // max_attempts, so that a broker outage of any length kills no row.
  bool counts = false;
  Millis pause_for{0};
  if (first_failed) {
    counts = static_cast<bool>(sink_.ping());
    const std::uint32_t attempts = rows[*first_failed].attempts + 1;
    pause_for = backoff(attempts);
    if (options_.retry_after) {
      if (auto asked = options_.retry_after()) pause_for = std::clamp(*asked, pause_for, options_.retry_max);
    }
  }

  std::vector<OutboxResult> results;
  results.reserve(rows.size());
  const TimePoint settle_now = SystemClock::instance().now();
  std::uint64_t sent = 0;
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const OutboxRow& row = rows[i];
    OutboxResult r;
    r.id = row.id;
    if (published[i]) {
      r.kind = OutboxResult::Kind::sent;
      ++sent;
    } else if (published[i].error().code == BrokerErrc::rejected || published[i].error().code == BrokerErrc::invalid) {
      r.kind = OutboxResult::Kind::dead;
      r.error = "the sink refused it: " + published[i].error().message;
    } else if (first_failed && i == *first_failed && counts && row.attempts + 1 >= options_.max_attempts) {
      r.kind = OutboxResult::Kind::dead;
      r.error = "gave up after " + std::to_string(row.attempts + 1) + " publishes; last: " + published[i].error().message;
    } else {
      // Only the first failed row was about itself (and only when the sink answers); the rest
      // waited behind it, or the sink was away: they keep their attempts.
      const bool own = first_failed && i == *first_failed && counts;
      r.kind = own ? OutboxResult::Kind::retry : OutboxResult::Kind::postpone;
      r.error = published[i].error().message;
      r.next_attempt = settle_now + pause_for;
    }
    if (r.kind == OutboxResult::Kind::dead) {
      stats_.dead.fetch_add(1, std::memory_order_relaxed);
      if (options_.on_warning) {
        options_.on_warning("row " + std::to_string(row.id) + " message_id=" + row.message.message_id + " dead: " + r.error);
      }
    } else if (r.kind != OutboxResult::Kind::sent) {
      stats_.retried.fetch_add(1, std::memory_order_relaxed);
    }
    results.push_back(std::move(r));
  }
  if (first_failed && options_.on_warning) {
    options_.on_warning("publishing row " + std::to_string(rows[*first_failed].id) + " failed: " +
                        published[*first_failed].error().message + "; this and later rows go again in " +
                        std::to_string(pause_for.count()) + " ms");
  }
  stats_.published.fetch_add(sent, std::memory_order_relaxed);
  stats_.ready.store(!first_failed || counts);
  if (auto settled = outbox_.settle(results, settle_now, options_.owner); !settled) {
    // Published but not recorded: they stay pending (or leased) and go again; consumers dedupe.
    stats_.outbox_errors.fetch_add(1, std::memory_order_relaxed);
    if (options_.on_warning) options_.on_warning("outbox: recording a published batch failed: " + settled.error().message);
    return backoff(++outbox_failures_);
  }
  if (options_.on_info) {
    options_.on_info("published " + std::to_string(sent) + " of " + std::to_string(rows.size()) + " rows to " + sink_.name());
  }
  if (first_failed) return pause_for;
  // A claim takes one row of a key at a time: a short batch with keys in it may have left the
  // keys' next rows behind, claimable now that these are sent.
  const bool keyed = std::any_of(rows.begin(), rows.end(), [](const OutboxRow& r) { return !r.message.ordering_key.empty(); });
  return rows.size() < options_.batch && !keyed ? options_.poll_interval : Millis{0};
}

void RelayLoop::run() {
  while (!stopping_.load()) {
    const Millis wait = round();
    if (wait.count() > 0 && !pause(wait)) break;
  }
}

}  // namespace idem::relay
