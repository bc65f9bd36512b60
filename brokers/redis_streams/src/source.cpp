#include "source.hpp"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>

namespace idem::redis_streams {
namespace {

using redis_detail::Failure;
using redis_detail::Reply;

// A blocking read is waited for a little past its BLOCK, so that Redis's own timeout (which ends
// it with a nil reply) normally comes first and the next receive does not find it outstanding.
constexpr Millis kReadGrace{25};

// A receive waits at most this long, however long it was asked to (Millis::max() would overflow
// the deadline): it returns nothing then, as for any wait that ran out.
constexpr Millis kLongestWait = std::chrono::hours(24);

// Delivery counts of entries read again from a pending list when XPENDING did not say (the entry
// changed hands in between): they were delivered before, so at least twice.
constexpr std::uint32_t kRedeliveredAtLeast = 2;

std::string default_consumer_name() {
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0 || host[0] == '\0') std::strcpy(host, "localhost");
  return std::string(host) + "-" + std::to_string(::getpid());
}

std::uint64_t random_token() {
  std::random_device rd;
  const std::uint64_t token = (static_cast<std::uint64_t>(rd()) << 32) | rd();
  return token == 0 ? 1 : token;  // 0 is what a default-constructed Delivery carries
}

std::string count_of(Millis d) { return std::to_string(d.count()); }

BrokerError invalid(std::string message) { return {BrokerErrc::invalid, std::move(message), false}; }

std::string list_ids(const std::vector<std::string>& ids) {
  std::string out;
  for (std::size_t i = 0; i < ids.size() && i < 10; ++i) out += (i ? ", " : "") + ids[i];
  if (ids.size() > 10) out += ", ...";
  return out;
}

}  // namespace

Millis Backoff::next() {
  const Millis current = next_;
  next_ = std::min(max_, next_ * 2);
  std::uniform_int_distribution<Millis::rep> pick(current.count() / 2, current.count());
  return Millis{pick(random_)};
}

// ---- opening ----------------------------------------------------------------------------------

BrokerResult<std::unique_ptr<StreamSource>> StreamSource::open(std::string_view url, const SourceSettings& settings,
                                                               RedisStreamEvents events) {
  auto parsed = parse_redis_stream_url(url, RedisStreamRole::source);
  if (!parsed) return std::unexpected(parsed.error());
  if (settings.prefetch < 1 || settings.prefetch > 65535) return std::unexpected(invalid("prefetch must be 1-65535"));
  if (settings.claim_idle <= Millis::zero()) return std::unexpected(invalid("claim_idle must be positive"));
  if (settings.connect_timeout <= Millis::zero()) return std::unexpected(invalid("connect_timeout must be positive"));
  if (settings.reconnect_min <= Millis::zero() || settings.reconnect_max < settings.reconnect_min) {
    return std::unexpected(invalid("reconnect_min must be positive and at most reconnect_max"));
  }
  const int wake_fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd < 0) {
    return std::unexpected(BrokerError{BrokerErrc::internal, std::string("eventfd: ") + std::strerror(errno)});
  }
  Endpoint endpoint(*parsed, url, settings.connect_timeout);
  std::unique_ptr<StreamSource> source(
      new StreamSource(std::move(*parsed), std::move(endpoint), settings, std::move(events), wake_fd));
  if (auto ok = source->connect(Steady::now()); !ok) return std::unexpected(ok.error());
  return source;
}

StreamSource::StreamSource(RedisStreamUrl url, Endpoint endpoint, SourceSettings settings, RedisStreamEvents events,
                           int wake_fd)
    : url_(std::move(url)),
      endpoint_(std::move(endpoint)),
      settings_(std::move(settings)),
      events_(std::move(events)),
      consumer_(settings_.consumer.empty() ? default_consumer_name() : settings_.consumer),
      wake_fd_(wake_fd),
      token_(random_token()),
      backoff_(settings_.reconnect_min, settings_.reconnect_max) {}

StreamSource::~StreamSource() { ::close(wake_fd_); }

// ---- connections --------------------------------------------------------------------------------

BrokerResult<Done> StreamSource::connect(Steady::time_point wait_until) {
  if (ctl_ && read_) return group_ready_ ? BrokerResult<Done>(Done{}) : ensure_group();
  auto now = Steady::now();
  if (now < next_connect_ && wait_until > now) {
    wait_for_wake(std::min(next_connect_, wait_until));
    now = Steady::now();
  }
  if (now < next_connect_) {
    BrokerError e = last_error_.value_or(BrokerError{BrokerErrc::unavailable, "not connected", false});
    // A refused login stays refused while it waits; anything else is "unavailable, retry".
    if (e.code != BrokerErrc::refused) e.code = BrokerErrc::unavailable;
    e.in_doubt = false;
    e.message += " (next attempt in " + std::to_string(std::chrono::ceil<Millis>(next_connect_ - now).count()) + " ms)";
    return std::unexpected(endpoint_.outgoing(std::move(e)));
  }
  auto ctl = Channel::open(endpoint_.address, endpoint_.settings);
  if (!ctl) return std::unexpected(fail(ctl.error(), {url_.stream}));
  auto read = Channel::open(endpoint_.address, endpoint_.settings);
  if (!read) return std::unexpected(fail(read.error(), {url_.stream}));
  ctl_.emplace(std::move(*ctl));
  read_.emplace(std::move(*read));
  read_answer_by_ = {};
  if (ever_connected_) {
    ++reconnects_;
    // A read whose reply the lost connection took still put its entries on this consumer's
    // pending list: read that list again before new entries, or those entries would wait for
    // claim_idle and run after later entries of their stream (and of their ordering key). Entries
    // still held here come again too: duplicates, which the consumer's store drops.
    own_pending_done_ = false;
    own_pending_cursor_ = "0";
  }
  ever_connected_ = true;
  group_ready_ = false;
  if (auto ok = ensure_group(); !ok) return ok;
  backoff_.reset();
  last_error_.reset();
  return Done{};
}

BrokerResult<Done> StreamSource::ensure_group() {
  auto reply = control({{"XGROUP", "CREATE", url_.stream, url_.group, url_.start, "MKSTREAM"}}, {url_.stream});
  if (!reply) return std::unexpected(reply.error());
  const Reply& r = reply->front();
  if (r.is_error() && error_code(r.str) != "BUSYGROUP") {
    // Refused (not a stream, an ACL, a cluster node): an operator must act; try again only after
    // the backoff, as for a server that is down.
    return std::unexpected(drop(map_error(reply_failure(r.str, endpoint_.address.str()), {url_.stream})));
  }
  if (!r.is_error() && group_created_before_) {
    // The group vanished (Redis restarted without persistence, or XGROUP DESTROY): its pending
    // lists went with it, so there is nothing of this consumer's to read again or claim.
    warn("consumer group \"" + url_.group + "\" of stream \"" + url_.stream + "\" had vanished; created again from " +
         (url_.start == "0" ? "the stream's first entry" : "the stream's end"));
    own_pending_done_ = true;
    requeued_.clear();
    claim_cursor_ = "0-0";
  }
  group_created_before_ = true;
  group_ready_ = true;
  return Done{};
}

BrokerError StreamSource::fail(const Failure& failure, ErrorContext context) {
  BrokerError e = map_error(failure, context);
  if (failure.kind == Failure::Kind::reply) return endpoint_.outgoing(std::move(e));
  return drop(std::move(e));
}

BrokerError StreamSource::drop(BrokerError error) {
  ctl_.reset();
  read_.reset();
  read_answer_by_ = {};
  next_connect_ = Steady::now() + backoff_.next();
  last_error_ = error;
  return endpoint_.outgoing(std::move(error));
}

BrokerError StreamSource::reply_error(const Reply& reply, ErrorContext context) {
  return endpoint_.outgoing(map_error(reply_failure(reply.str, endpoint_.address.str()), context));
}

BrokerResult<Done> StreamSource::group_gone(const Reply& reply) {
  // NOGROUP: the group is gone; UNBLOCKED: the whole stream was deleted under a blocked read.
  const auto code = error_code(reply.str);
  if (code != "NOGROUP" && code != "UNBLOCKED") return std::unexpected(reply_error(reply, {url_.stream}));
  group_ready_ = false;
  return ensure_group();
}

BrokerResult<std::vector<Reply>> StreamSource::control(const std::vector<std::vector<std::string>>& commands,
                                                       ErrorContext context) {
  if (!ctl_) return std::unexpected(endpoint_.outgoing({BrokerErrc::unavailable, "not connected", false}));
  for (const auto& command : commands) ctl_->send(command);
  const auto deadline = Steady::now() + settings_.connect_timeout;
  std::vector<Reply> replies;
  replies.reserve(commands.size());
  while (replies.size() < commands.size()) {
    auto event = ctl_->wait(deadline);
    if (!event) return std::unexpected(fail(event.error(), context));
    if (event->kind != Event::Kind::reply) {
      return std::unexpected(
          fail(Failure{Failure::Kind::timeout,
                       commands[replies.size()].front() + " got no reply within connect_timeout", ctl_->node()},
               context));
    }
    replies.push_back(std::move(event->reply));
  }
  return replies;
}

// ---- receive ------------------------------------------------------------------------------------

BrokerResult<std::vector<Delivery>> StreamSource::receive(std::size_t max, Millis wait) {
  std::vector<Delivery> out;
  if (max == 0) return out;
  const std::size_t limit = std::min(max, settings_.prefetch);
  const auto until = Steady::now() + std::clamp(wait, Millis::zero(), kLongestWait);
  if (auto ok = connect(until); !ok) return std::unexpected(ok.error());
  out.reserve(limit);
  take_buffered(out, limit);
  using Step = BrokerResult<Done> (StreamSource::*)(std::vector<Delivery>&, std::size_t);
  for (Step step :
       {&StreamSource::redeliver_requeued, &StreamSource::scan_own_pending, &StreamSource::claim_from_idle}) {
    if (out.size() >= limit || !ctl_) break;
    // Deliveries already taken are returned even when a later step fails: their ids stay valid.
    if (auto ok = (this->*step)(out, limit); !ok) {
      if (out.empty()) return std::unexpected(ok.error());
      return out;
    }
  }
  if (out.size() < limit && read_) {
    if (auto ok = read_new(out, limit, out.empty() ? until : Steady::now()); !ok && out.empty()) {
      return std::unexpected(ok.error());
    }
  }
  return out;
}

void StreamSource::take_buffered(std::vector<Delivery>& out, std::size_t limit) {
  while (out.size() < limit && !buffered_.empty()) {
    out.push_back(std::move(buffered_.front()));
    buffered_.pop_front();
  }
}

BrokerResult<Done> StreamSource::redeliver_requeued(std::vector<Delivery>& out, std::size_t limit) {
  if (requeued_.empty()) return Done{};
  const std::size_t n = std::min(limit - out.size(), requeued_.size());
  const std::vector<std::string> ids(requeued_.begin(), requeued_.begin() + static_cast<std::ptrdiff_t>(n));
  // Reading this consumer's pending list from just below an id gives that entry (if it is still
  // this consumer's), counts the delivery and restarts its idle time, so others do not claim it.
  std::vector<std::vector<std::string>> commands;
  for (const auto& id : ids) {
    commands.push_back({"XREADGROUP", "GROUP", url_.group, consumer_, "COUNT", "1", "STREAMS", url_.stream,
                        previous_id(id).value_or("0-0")});
    commands.push_back({"XPENDING", url_.stream, url_.group, id, id, "1", consumer_});
  }
  auto replies = control(commands, {url_.stream});
  if (!replies) return std::unexpected(replies.error());
  requeued_.erase(requeued_.begin(), requeued_.begin() + static_cast<std::ptrdiff_t>(n));
  std::vector<std::string> deleted;
  for (std::size_t i = 0; i < n; ++i) {
    const Reply& read = (*replies)[2 * i];
    if (read.is_error()) {
      // Not redelivered now: put the rest back; they are still pending either way.
      requeued_.insert(requeued_.begin(), ids.begin() + static_cast<std::ptrdiff_t>(i), ids.end());
      return group_gone(read);
    }
    auto entries = parse_read_reply(read);
    if (!entries) return std::unexpected(endpoint_.outgoing({BrokerErrc::internal, entries.error(), false}));
    // Gone from this consumer's list (acked, or claimed by another after claim_idle): not ours.
    if (entries->empty() || entries->front().id != ids[i]) continue;
    if (!entries->front().fields) {
      deleted.push_back(ids[i]);
      continue;
    }
    std::uint32_t count = kRedeliveredAtLeast;
    if (auto rows = parse_pending_counts((*replies)[2 * i + 1]);
        rows && !rows->empty() && rows->front().first == ids[i]) {
      count = rows->front().second;
    }
    auto delivery = make_delivery(std::move(entries->front()), count);
    if (!delivery) return std::unexpected(delivery.error());
    out.push_back(std::move(*delivery));
  }
  return settle_deleted(deleted, "read again after a requeue");
}

BrokerResult<Done> StreamSource::scan_own_pending(std::vector<Delivery>& out, std::size_t limit) {
  // Until this scan is done, every receive fills up from it (it stops only on a short batch), so
  // no new read or claim adds entries above its cursor that it would then read twice.
  if (own_pending_done_) return Done{};
  const std::size_t room = limit - out.size();
  const std::string from = own_pending_cursor_ == "0" ? "-" : "(" + own_pending_cursor_;
  auto replies = control({{"XREADGROUP", "GROUP", url_.group, consumer_, "COUNT", std::to_string(room), "STREAMS",
                           url_.stream, own_pending_cursor_},
                          {"XPENDING", url_.stream, url_.group, from, "+", std::to_string(room), consumer_}},
                         {url_.stream});
  if (!replies) return std::unexpected(replies.error());
  if ((*replies)[0].is_error()) return group_gone((*replies)[0]);
  auto entries = parse_read_reply((*replies)[0]);
  if (!entries) return std::unexpected(endpoint_.outgoing({BrokerErrc::internal, entries.error(), false}));
  std::map<std::string, std::uint32_t, std::less<>> counts;
  if (auto rows = parse_pending_counts((*replies)[1])) counts.insert(rows->begin(), rows->end());
  if (entries->size() < room) own_pending_done_ = true;
  if (!entries->empty()) own_pending_cursor_ = entries->back().id;
  std::vector<std::string> deleted;
  for (auto& entry : *entries) {
    if (!entry.fields) {
      deleted.push_back(entry.id);
      continue;
    }
    const auto found = counts.find(entry.id);
    auto delivery = make_delivery(std::move(entry), found == counts.end() ? kRedeliveredAtLeast : found->second);
    if (!delivery) return std::unexpected(delivery.error());
    out.push_back(std::move(*delivery));
  }
  return settle_deleted(deleted, "pending for this consumer");
}

BrokerResult<Done> StreamSource::claim_from_idle(std::vector<Delivery>& out, std::size_t limit) {
  const auto now = Steady::now();
  if (now < next_claim_) return Done{};
  auto reply = control({{"XAUTOCLAIM", url_.stream, url_.group, consumer_, count_of(settings_.claim_idle),
                         claim_cursor_, "COUNT", std::to_string(limit - out.size())}},
                       {url_.stream});
  if (!reply) return std::unexpected(reply.error());
  if (reply->front().is_error()) return group_gone(reply->front());
  auto claimed = parse_claim_reply(reply->front());
  if (!claimed) return std::unexpected(endpoint_.outgoing({BrokerErrc::internal, claimed.error(), false}));
  // A scan of the whole group's pending list ends with cursor 0-0; the next starts after half
  // of claim_idle, so an entry is taken over at most ~1.5 claim_idle after its last delivery.
  claim_cursor_ = claimed->cursor;
  next_claim_ = claim_cursor_ == "0-0" ? now + std::max(settings_.claim_idle / 2, Millis{1}) : now;
  std::vector<std::string> deleted = std::move(claimed->deleted);
  std::vector<RawEntry> live;
  for (auto& entry : claimed->entries) {
    if (entry.fields) {
      live.push_back(std::move(entry));
    } else {
      deleted.push_back(std::move(entry.id));  // Redis 6.2 returns them among the entries
    }
  }
  if (!live.empty()) {
    std::vector<std::vector<std::string>> commands;
    for (const auto& entry : live) commands.push_back({"XPENDING", url_.stream, url_.group, entry.id, entry.id, "1"});
    auto counts = control(commands, {url_.stream});
    if (!counts) return std::unexpected(counts.error());
    for (std::size_t i = 0; i < live.size(); ++i) {
      std::uint32_t count = kRedeliveredAtLeast;
      if (auto rows = parse_pending_counts((*counts)[i]); rows && !rows->empty()) count = rows->front().second;
      // Claimed back by this consumer itself before its requeue was served: deliver it once.
      std::erase(requeued_, live[i].id);
      auto delivery = make_delivery(std::move(live[i]), count);
      if (!delivery) return std::unexpected(delivery.error());
      out.push_back(std::move(*delivery));
    }
  }
  return settle_deleted(deleted, "claimed from an idle consumer");
}

BrokerResult<Done> StreamSource::read_new(std::vector<Delivery>& out, std::size_t limit, Steady::time_point until) {
  while (true) {
    auto now = Steady::now();
    Steady::time_point wait_until = until;
    bool wakeable = out.empty();
    if (read_->outstanding() == 0) {
      const std::size_t room = limit - out.size();
      if (room == 0) return Done{};
      const auto block = out.empty() ? std::chrono::floor<Millis>(until - now) : Millis::zero();
      std::vector<std::string> args{"XREADGROUP", "GROUP", url_.group, consumer_, "COUNT", std::to_string(room)};
      // BLOCK 0 would wait forever: a read with no time to wait does not block at all.
      if (block > Millis::zero()) {
        args.insert(args.end(), {"BLOCK", count_of(block)});
        wait_until = until + kReadGrace;
      } else {
        wakeable = false;
      }
      args.insert(args.end(), {"STREAMS", url_.stream, ">"});
      read_->send(args);
      read_answer_by_ = now + std::max(block, Millis::zero()) + settings_.connect_timeout;
      if (block <= Millis::zero()) wait_until = read_answer_by_;
    }
    auto event = read_->wait(std::min(wait_until, read_answer_by_), wakeable ? wake_fd_ : -1);
    if (!event) return std::unexpected(fail(event.error(), {url_.stream}));
    switch (event->kind) {
      case Event::Kind::woken:
        drain_wake();
        return Done{};
      case Event::Kind::expired:
        if (Steady::now() >= read_answer_by_) {
          return std::unexpected(
              fail(Failure{Failure::Kind::timeout, "XREADGROUP got no reply within connect_timeout after its BLOCK",
                           read_->node()},
                   {url_.stream}));
        }
        return Done{};  // still outstanding: the next receive collects it
      case Event::Kind::reply:
        if (auto ok = take_read_reply(event->reply, out, limit); !ok) return ok;
        break;
    }
    if (!out.empty() || Steady::now() >= until) return Done{};
    // Nothing came and time is left: a reply of an earlier receive's read, or a BLOCK that ended
    // a little early. Read again for the rest of the wait.
  }
}

BrokerResult<Done> StreamSource::take_read_reply(const Reply& reply, std::vector<Delivery>& out, std::size_t limit) {
  if (reply.is_error()) return group_gone(reply);
  auto entries = parse_read_reply(reply);
  if (!entries) return std::unexpected(endpoint_.outgoing({BrokerErrc::internal, entries.error(), false}));
  for (auto& entry : *entries) {
    if (!entry.fields) continue;  // new entries always have fields; nothing to settle
    auto delivery = make_delivery(std::move(entry), 1);
    if (!delivery) return std::unexpected(delivery.error());
    // A read sent by an earlier receive may bring more than this one takes: keep the rest, in
    // order, for the next receive (they are on this consumer's pending list meanwhile).
    if (out.size() < limit) {
      out.push_back(std::move(*delivery));
    } else {
      buffered_.push_back(std::move(*delivery));
    }
  }
  return Done{};
}

BrokerResult<Delivery> StreamSource::make_delivery(RawEntry entry, std::uint32_t delivery_count) {
  Delivery d;
  if (auto ok = decode_fields(*entry.fields, d); !ok) {
    return std::unexpected(endpoint_.outgoing({BrokerErrc::internal, "entry " + entry.id + ": " + ok.error(), false}));
  }
  d.delivery_count = std::max<std::uint32_t>(delivery_count, 1);
  d.redelivered = d.delivery_count > 1;
  d.broker_ref = std::move(entry.id);
  d.handle = ++handles_;
  d.connection = token_;
  return d;
}

BrokerResult<Done> StreamSource::settle_deleted(const std::vector<std::string>& ids, std::string_view how) {
  if (ids.empty()) return Done{};
  std::vector<std::string> args{"XACK", url_.stream, url_.group};
  args.insert(args.end(), ids.begin(), ids.end());
  auto reply = control({args}, {url_.stream});
  if (!reply) return std::unexpected(reply.error());
  if (reply->front().is_error()) return group_gone(reply->front());
  deleted_while_pending_ += ids.size();
  warn(std::to_string(ids.size()) + " entr" + (ids.size() == 1 ? "y" : "ies") + " " + std::string(how) + " (" +
       list_ids(ids) + ") had been deleted from stream \"" + url_.stream +
       "\" before they were acked (MAXLEN trimming or XDEL): acked and skipped; " +
       std::to_string(deleted_while_pending_) + " so far");
  return Done{};
}

// ---- settling deliveries ------------------------------------------------------------------------

BrokerResult<Done> StreamSource::check_own(const Delivery& delivery) const {
  if (delivery.connection != token_) {
    return std::unexpected(
        endpoint_.outgoing(invalid("delivery " + delivery.broker_ref + " is not one of this source's")));
  }
  if (!parse_entry_id(delivery.broker_ref)) {
    return std::unexpected(endpoint_.outgoing(invalid("delivery has no stream entry id (broker_ref)")));
  }
  return Done{};
}

BrokerResult<Done> StreamSource::ack(std::span<const Delivery> deliveries) {
  if (deliveries.empty()) return Done{};
  std::vector<std::string> args{"XACK", url_.stream, url_.group};
  for (const Delivery& d : deliveries) {
    if (auto ok = check_own(d); !ok) return ok;
    args.push_back(d.broker_ref);
  }
  if (auto ok = connect(Steady::now()); !ok) return ok;
  auto reply = control({args}, {url_.stream});
  if (!reply) return std::unexpected(reply.error());
  const Reply& r = reply->front();
  if (r.is_error()) {
    if (error_code(r.str) == "NOGROUP") {
      group_ready_ = false;
      return std::unexpected(endpoint_.outgoing(
          {BrokerErrc::stale, "consumer group \"" + url_.group + "\" is gone: nothing was acked", false}));
    }
    return std::unexpected(reply_error(r, {url_.stream}));
  }
  // XACK counts only entries still pending: one acked twice, or acked by a consumer that claimed
  // it, is done with either way.
  return Done{};
}

BrokerResult<Done> StreamSource::requeue(const Delivery& delivery) {
  if (auto ok = check_own(delivery); !ok) return ok;
  // Nothing to tell Redis: the entry is still on this consumer's pending list. The next receive
  // reads it again from there; if this consumer goes away first, it is claimed by another once
  // idle for claim_idle.
  if (std::find(requeued_.begin(), requeued_.end(), delivery.broker_ref) == requeued_.end()) {
    requeued_.push_back(delivery.broker_ref);
  }
  return Done{};
}

BrokerResult<Done> StreamSource::dead_letter(const Delivery& delivery, const DeadLetterReason& why) {
  if (auto ok = check_own(delivery); !ok) return ok;
  if (auto ok = connect(Steady::now()); !ok) return ok;
  std::vector<std::string> add{"XADD", url_.dead_letter, "*"};
  append_fields(delivery, add);
  add.insert(add.end(), {"reason", why.reason, "detail", why.detail, "last_error", why.last_error, "attempts",
                         std::to_string(why.attempts), "source_stream", url_.stream, "source_id", delivery.broker_ref});
  // Both keys are on this server (the URL names one standalone server), so one transaction
  // appends the copy and acks the original.
  auto replies = control({{"MULTI"}, add, {"XACK", url_.stream, url_.group, delivery.broker_ref}, {"EXEC"}},
                         {url_.dead_letter, /*appends=*/true});
  if (!replies) return std::unexpected(replies.error());
  const Reply& multi = (*replies)[0];
  const Reply& exec = (*replies)[3];
  if (multi.is_error()) return std::unexpected(reply_error(multi, {url_.dead_letter}));
  if (!exec.is_array() || exec.elements.size() != 2) {
    // EXECABORT: a command was refused when queued (OOM, an ACL): neither ran.
    if ((*replies)[1].is_error()) return std::unexpected(reply_error((*replies)[1], {url_.dead_letter}));
    if ((*replies)[2].is_error()) return std::unexpected(reply_error((*replies)[2], {url_.stream}));
    if (exec.is_error()) return std::unexpected(reply_error(exec, {url_.dead_letter}));
    return std::unexpected(endpoint_.outgoing({BrokerErrc::internal, "unexpected reply to EXEC", false}));
  }
  const Reply& added = exec.elements[0];
  const Reply& acked = exec.elements[1];
  if (added.is_error()) {
    // A transaction does not roll back: the XACK ran although the XADD failed (the dead-letter
    // key holds another type). Put the entry back on this consumer's pending list, so that it is
    // not lost; it is delivered again (claimed after claim_idle, or read again after a restart).
    BrokerError e = map_error(reply_failure(added.str, endpoint_.address.str()), {url_.dead_letter});
    if (acked.type == Reply::Type::integer && acked.integer > 0) {
      auto back = control({{"XCLAIM", url_.stream, url_.group, consumer_, "0", delivery.broker_ref, "FORCE", "JUSTID"}},
                          {url_.stream});
      if (back && !back->front().is_error()) {
        e.message += "; the entry stays pending";
      } else {
        e.message += "; and it could not be put back on the pending list (" +
                     (back ? back->front().str : back.error().message) + "): it is acked without a dead-letter copy";
      }
    }
    return std::unexpected(endpoint_.outgoing(std::move(e)));
  }
  if (acked.is_error()) {
    // The copy is written; a group that vanished has no pending entry left to remove.
    if (error_code(acked.str) == "NOGROUP") {
      group_ready_ = false;
      return Done{};
    }
    return std::unexpected(reply_error(acked, {url_.stream}));
  }
  return Done{};
}

BrokerResult<Done> StreamSource::ping() {
  if (auto ok = connect(Steady::now()); !ok) return ok;
  auto reply = control({{"PING"}}, {url_.stream});
  if (!reply) return std::unexpected(reply.error());
  if (reply->front().is_error()) return std::unexpected(reply_error(reply->front(), {url_.stream}));
  return Done{};
}

// ---- waking ---------------------------------------------------------------------------------------

void StreamSource::wake() {
  const std::uint64_t one = 1;
  // EAGAIN (the counter is saturated) still leaves it readable: the wake is not lost.
  [[maybe_unused]] const auto written = ::write(wake_fd_, &one, sizeof one);
}

void StreamSource::drain_wake() {
  std::uint64_t value = 0;
  [[maybe_unused]] const auto got = ::read(wake_fd_, &value, sizeof value);
}

bool StreamSource::wait_for_wake(Steady::time_point until) {
  while (true) {
    const auto now = Steady::now();
    if (now >= until) return false;
    pollfd fd{wake_fd_, POLLIN, 0};
    const auto left = std::chrono::ceil<Millis>(until - now).count();
    const int n = ::poll(&fd, 1, static_cast<int>(std::min<Millis::rep>(left, 60'000)));
    if (n < 0 && errno != EINTR) return false;
    if (n > 0 && (fd.revents & POLLIN)) {
      drain_wake();
      return true;
    }
  }
}

void StreamSource::warn(const std::string& line) const {
  if (events_.on_warning) events_.on_warning(scrub_secrets(endpoint_.name + ": " + line, endpoint_.raw_url));
}

}  // namespace idem::redis_streams

namespace idem {

BrokerResult<std::unique_ptr<MessageSource>> open_redis_stream_source(std::string_view url,
                                                                      const SourceSettings& settings,
                                                                      RedisStreamEvents events) {
  auto source = redis_streams::StreamSource::open(url, settings, std::move(events));
  if (!source) return std::unexpected(source.error());
  return std::unique_ptr<MessageSource>(std::move(*source));
}

}  // namespace idem
