#include "node.hpp"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <system_error>

namespace idem::redis_detail {
namespace {

const std::vector<std::string> kAsking{"ASKING"};

void bump_max(std::atomic<std::uint64_t>& max, std::uint64_t value) {
  auto seen = max.load(std::memory_order_relaxed);
  while (value > seen && !max.compare_exchange_weak(seen, value, std::memory_order_relaxed)) {
  }
}

}  // namespace

Node::Node(Address address, const Settings& settings, Dispatcher& dispatcher, Counters& counters)
    : address_(std::move(address)),
      settings_(settings),
      dispatcher_(dispatcher),
      counters_(counters),
      backoff_(settings.backoff_min) {
  wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake_fd_ < 0) throw std::system_error(errno, std::generic_category(), "eventfd");
  thread_ = std::thread([this] { run(); });
}

Node::~Node() {
  stop();
  join();
  ::close(wake_fd_);
}

void Node::stop() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  const std::uint64_t one = 1;
  [[maybe_unused]] auto n = ::write(wake_fd_, &one, sizeof one);
}

void Node::join() {
  if (thread_.joinable()) thread_.join();
}

void Node::submit(Op op) {
  {
    std::unique_lock lock(mutex_);
    if (!closed_) {
      const bool was_empty = queue_.empty();
      queue_.push_back(std::move(op));
      lock.unlock();
      if (was_empty) {
        const std::uint64_t one = 1;
        [[maybe_unused]] auto n = ::write(wake_fd_, &one, sizeof one);
      }
      return;
    }
  }
  fail(op, Failure{Failure::Kind::closing, "", address_.str()});
}

void Node::submit_many(std::vector<Op> ops) {
  if (ops.empty()) return;
  {
    std::unique_lock lock(mutex_);
    if (!closed_) {
      const bool was_empty = queue_.empty();
      for (auto& op : ops) queue_.push_back(std::move(op));
      lock.unlock();
      if (was_empty) {
        const std::uint64_t one = 1;
        [[maybe_unused]] auto n = ::write(wake_fd_, &one, sizeof one);
      }
      return;
    }
  }
  for (auto& op : ops) fail(op, Failure{Failure::Kind::closing, "", address_.str()});
}

void Node::fail(Op& op, const Failure& why) {
  counters_.replies.fetch_add(1, std::memory_order_relaxed);
  if (why.kind == Failure::Kind::timeout) counters_.timeouts.fetch_add(1, std::memory_order_relaxed);
  op.done(std::unexpected(map_error(why)));
}

void Node::run() {
  block_sigpipe_on_this_thread();  // a write to a Redis that went away fails with EPIPE
  std::vector<Op> batch;
  for (;;) {
    {
      std::lock_guard lock(mutex_);
      batch.swap(queue_);
      if (batch.empty() && inflight_.empty() && stopping_) {
        closed_ = true;
        break;
      }
    }
    if (!batch.empty()) {
      start(std::move(batch));
      batch.clear();  // moved-from: make it a valid empty vector again
    }

    int timeout_ms = -1;
    if (!inflight_.empty()) {
      auto earliest = inflight_.front().op.deadline;
      for (const auto& f : inflight_) earliest = std::min(earliest, f.op.deadline);
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(earliest - Steady::now()).count();
      timeout_ms = static_cast<int>(std::clamp<long long>(left, 0, 60'000));
    }
    pollfd fds[2] = {{wake_fd_, POLLIN, 0}, {conn_ ? conn_->fd() : -1, 0, 0}};
    if (conn_) fds[1].events = static_cast<short>(POLLIN | (write_pending_ ? POLLOUT : 0));
    const int ready = ::poll(fds, 2, timeout_ms);
    if (ready < 0 && errno != EINTR) {
      drop_connection(Failure{Failure::Kind::io, std::string("poll: ") + std::strerror(errno), address_.str()});
      continue;
    }
    if (fds[0].revents & POLLIN) {
      std::uint64_t value = 0;
      [[maybe_unused]] auto n = ::read(wake_fd_, &value, sizeof value);
    }
    if (conn_ && (fds[1].revents & POLLOUT)) {
      auto flushed = conn_->flush();
      if (!flushed) {
        drop_connection(flushed.error());
      } else {
        write_pending_ = !*flushed;
      }
    }
    if (conn_ && (fds[1].revents & (POLLIN | POLLERR | POLLHUP))) {
      if (auto got = conn_->read(); !got) {
        drop_connection(got.error());
      } else {
        while (conn_) {
          auto reply = conn_->next_reply();
          if (!reply) {
            drop_connection(reply.error());
            break;
          }
          if (!*reply) break;
          on_reply(std::move(**reply));
        }
      }
    }
    if (!inflight_.empty()) {
      const auto now = Steady::now();
      for (const auto& f : inflight_) {
        if (f.op.deadline <= now) {
          drop_connection(Failure{Failure::Kind::timeout, "", address_.str()});
          break;
        }
      }
    }
  }
  // Closed: anything submitted from now on fails in submit().
}

bool Node::ensure_connected(Failure& why) {
  if (conn_) return true;
  const auto now = Steady::now();
  if (now < next_connect_) {
    const auto wait = std::chrono::ceil<std::chrono::milliseconds>(next_connect_ - now).count();
    why = Failure{Failure::Kind::down, last_connect_error_ + " (next attempt in " + std::to_string(wait) + " ms)",
                  address_.str()};
    return false;
  }
  auto opened = Connection::open(address_, settings_.connect, /*nonblocking=*/true);
  if (!opened) {
    counters_.connect_failures.fetch_add(1, std::memory_order_relaxed);
    last_connect_error_ = opened.error().detail;
    next_connect_ = Steady::now() + backoff_;
    backoff_ = std::min(backoff_ * 2, settings_.backoff_max);
    why = opened.error();
    dispatcher_.node_failed(address_, /*unreachable=*/true);
    return false;
  }
  counters_.connects.fetch_add(1, std::memory_order_relaxed);
  conn_ = std::move(*opened);
  write_pending_ = false;
  backoff_ = settings_.backoff_min;
  return true;
}

void Node::start(std::vector<Op> batch) {
  Failure why;
  if (!ensure_connected(why)) {
    for (auto& op : batch) fail(op, why);
    return;
  }
  const bool wait = settings_.wait_replicas > 0;
  const std::vector<std::string> wait_command{"WAIT", std::to_string(settings_.wait_replicas),
                                              std::to_string(settings_.wait_timeout.count())};
  const auto now = Steady::now();
  std::uint64_t sent = 0;
  for (auto& op : batch) {
    if (op.deadline <= now) {
      fail(op, Failure{Failure::Kind::timeout, "deadline passed before the command was sent", address_.str()});
      continue;
    }
    InFlight f;
    f.asking_reply_pending = op.asking;
    f.wait_reply_pending = wait && op.write;
    if (op.asking) conn_->append(kAsking);
    conn_->append(op.args);
    if (f.wait_reply_pending) conn_->append(wait_command);
    f.op = std::move(op);
    inflight_.push_back(std::move(f));
    ++sent;
  }
  if (sent == 0) return;
  counters_.commands.fetch_add(sent, std::memory_order_relaxed);
  counters_.batches.fetch_add(1, std::memory_order_relaxed);
  bump_max(counters_.largest_batch, sent);
  auto flushed = conn_->flush();
  if (!flushed) {
    drop_connection(flushed.error());
    return;
  }
  write_pending_ = !*flushed;
}

void Node::on_reply(Reply reply) {
  if (inflight_.empty()) {
    drop_connection(Failure{Failure::Kind::protocol, "a reply nobody asked for", address_.str()});
    return;
  }
  InFlight& front = inflight_.front();
  if (front.asking_reply_pending) {  // ASKING's +OK; an error would repeat on the command itself
    front.asking_reply_pending = false;
    return;
  }
  if (!front.reply) {
    front.reply = std::move(reply);
    if (front.wait_reply_pending) return;
    InFlight done = std::move(front);
    inflight_.pop_front();
    finish(std::move(done.op), std::move(*done.reply), std::nullopt);
    return;
  }
  InFlight done = std::move(front);
  inflight_.pop_front();
  finish(std::move(done.op), std::move(*done.reply), std::move(reply));
}

void Node::finish(Op op, Reply reply, std::optional<Reply> wait_reply) {
  if (reply.is_error()) {
    const ErrorAction action = classify_error_reply(reply.str);
    switch (action) {
      case ErrorAction::moved:
      case ErrorAction::ask: {
        auto redirect = parse_redirect(reply.str);
        if (!redirect) break;
        if (redirect->to.host.empty()) redirect->to.host = address_.host;
        const bool ask = action == ErrorAction::ask;
        (ask ? counters_.ask : counters_.moved).fetch_add(1, std::memory_order_relaxed);
        if (++op.redirects > settings_.max_redirects) {
          fail(op, Failure{Failure::Kind::redirects, reply.str, address_.str()});
          return;
        }
        if (!ask) dispatcher_.moved(redirect->slot, redirect->to);
        op.asking = ask;
        dispatcher_.send_to(redirect->to, std::move(op));
        return;
      }
      case ErrorAction::noscript:
        if (op.script && !op.args.empty() && op.args[0] == "EVALSHA") {
          // EVAL runs the script and caches it on this node: later EVALSHAs find it again.
          counters_.noscript.fetch_add(1, std::memory_order_relaxed);
          op.args[0] = "EVAL";
          op.args[1] = std::string(op.script->source);
          submit(std::move(op));
          return;
        }
        break;
      case ErrorAction::retry: {
        const Millis delay = settings_.retry_delay * (1 << std::min(op.retries, 10));
        if (op.retries < settings_.max_retries && Steady::now() + delay < op.deadline) {
          ++op.retries;
          counters_.retries.fetch_add(1, std::memory_order_relaxed);
          dispatcher_.node_failed(address_, /*unreachable=*/false);  // CLUSTERDOWN, READONLY: map stale?
          op.asking = false;
          dispatcher_.retry_later(std::move(op), delay);
          return;
        }
        fail(op, Failure{Failure::Kind::retries, reply.str, address_.str()});
        return;
      }
      case ErrorAction::report:
        break;
    }
    if (op.raw_errors) {
      counters_.replies.fetch_add(1, std::memory_order_relaxed);
      op.done(std::move(reply));
      return;
    }
    fail(op, Failure{Failure::Kind::reply, reply.str, address_.str()});
    return;
  }
  if (wait_reply) {
    const bool ok = wait_reply->type == Reply::Type::integer && wait_reply->integer >= settings_.wait_replicas;
    if (!ok) {
      const std::string acked =
          wait_reply->type == Reply::Type::integer ? std::to_string(wait_reply->integer) : wait_reply->str;
      fail(op, Failure{Failure::Kind::replication,
                       "acknowledged by " + acked + " of " + std::to_string(settings_.wait_replicas) + " replicas",
                       address_.str()});
      return;
    }
  }
  counters_.replies.fetch_add(1, std::memory_order_relaxed);
  op.done(std::move(reply));
}

void Node::drop_connection(const Failure& why) {
  conn_.reset();
  write_pending_ = false;
  counters_.connections_lost.fetch_add(1, std::memory_order_relaxed);
  next_connect_ = Steady::now();  // the next command reconnects at once; a failure starts the backoff
  auto lost = std::move(inflight_);
  inflight_.clear();
  dispatcher_.node_failed(address_, /*unreachable=*/true);
  for (auto& f : lost) fail(f.op, why);
}

}  // namespace idem::redis_detail
