#include "idem/redis_wire/connection.hpp"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <hiredis/hiredis.h>
#include <sys/time.h>

#include <cerrno>
#include <ctime>
#include <cstring>

namespace idem::redis_detail {
namespace {

timeval to_timeval(Millis d) {
  const auto ms = d.count() > 0 ? d.count() : 1;
  return timeval{static_cast<time_t>(ms / 1000), static_cast<suseconds_t>((ms % 1000) * 1000)};
}

Reply convert(const redisReply* r) {
  Reply out;
  switch (r->type) {
    case REDIS_REPLY_STRING:
      out.type = Reply::Type::string;
      out.str.assign(r->str, r->len);
      break;
    case REDIS_REPLY_STATUS:
      out.type = Reply::Type::status;
      out.str.assign(r->str, r->len);
      break;
    case REDIS_REPLY_ERROR:
      out.type = Reply::Type::error;
      out.str.assign(r->str, r->len);
      break;
    case REDIS_REPLY_INTEGER:
      out.type = Reply::Type::integer;
      out.integer = r->integer;
      break;
    case REDIS_REPLY_ARRAY:
      out.type = Reply::Type::array;
      out.elements.reserve(r->elements);
      for (std::size_t i = 0; i < r->elements; ++i) out.elements.push_back(convert(r->element[i]));
      break;
    default:
      out.type = Reply::Type::nil;
      break;
  }
  return out;
}

struct FreeReply {
  void operator()(void* r) const { freeReplyObject(r); }
};

bool timed_out(const redisContext* c, int saved_errno) {
  return saved_errno == EAGAIN || saved_errno == EWOULDBLOCK || saved_errno == ETIMEDOUT ||
         std::strstr(c->errstr, "timed out") != nullptr || std::strstr(c->errstr, "temporarily unavailable") != nullptr;
}

}  // namespace

void Connection::Free::operator()(redisContext* c) const { redisFree(c); }

Connection::Connection(std::unique_ptr<redisContext, Free> ctx, Address address)
    : ctx_(std::move(ctx)), address_(std::move(address)) {}
Connection::Connection(Connection&&) noexcept = default;
Connection& Connection::operator=(Connection&&) noexcept = default;
Connection::~Connection() = default;

int Connection::fd() const { return ctx_->fd; }

namespace {

thread_local bool sigpipe_blocked = false;  // by block_sigpipe_on_this_thread

// SIGPIPE blocked for one scope on a thread that does not block it for good; a SIGPIPE the scope
// raised (pending, since blocked) is consumed before the old mask comes back.
class SigpipeScope {
 public:
  SigpipeScope() {
    if (sigpipe_blocked) return;
    active_ = true;
    sigemptyset(&pipe_);
    sigaddset(&pipe_, SIGPIPE);
    sigset_t pending;
    sigpending(&pending);
    already_pending_ = sigismember(&pending, SIGPIPE) == 1;
    pthread_sigmask(SIG_BLOCK, &pipe_, &old_);
  }
  ~SigpipeScope() {
    if (!active_) return;
    if (!already_pending_) {
      sigset_t pending;
      sigpending(&pending);
      if (sigismember(&pending, SIGPIPE) == 1) {
        const timespec zero{0, 0};
        while (sigtimedwait(&pipe_, nullptr, &zero) < 0 && errno == EINTR) {
        }
      }
    }
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }
  SigpipeScope(const SigpipeScope&) = delete;
  SigpipeScope& operator=(const SigpipeScope&) = delete;

 private:
  bool active_ = false;
  bool already_pending_ = false;
  sigset_t pipe_{};
  sigset_t old_{};
};

}  // namespace

void block_sigpipe_on_this_thread() {
  sigset_t pipe;
  sigemptyset(&pipe);
  sigaddset(&pipe, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipe, nullptr);
  sigpipe_blocked = true;
}

std::optional<HandshakeRefusal> handshake_refusal(const Failure& failure) {
  if (failure.kind != Failure::Kind::connect) return std::nullopt;
  const std::string_view detail = failure.detail;
  for (std::string_view command : {std::string_view("AUTH"), std::string_view("SELECT")}) {
    if (detail.size() > command.size() + 2 && detail.starts_with(command) &&
        detail.substr(command.size(), 2) == ": ") {
      return HandshakeRefusal{command, detail.substr(command.size() + 2)};
    }
  }
  return std::nullopt;
}

Failure Connection::failure(Failure::Kind kind) const {
  return Failure{kind, ctx_ && ctx_->errstr[0] ? ctx_->errstr : "connection error", address_.str()};
}

std::expected<Connection, Failure> Connection::open(const Address& address, const ConnectSettings& settings,
                                                    bool nonblocking) {
  errno = 0;
  std::unique_ptr<redisContext, Free> ctx(
      redisConnectWithTimeout(address.host.c_str(), address.port, to_timeval(settings.connect_timeout)));
  const int saved_errno = errno;
  if (!ctx) return std::unexpected(Failure{Failure::Kind::connect, "out of memory", address.str()});
  if (ctx->err) {
    const auto kind = timed_out(ctx.get(), saved_errno) ? Failure::Kind::connect_timeout : Failure::Kind::connect;
    return std::unexpected(Failure{kind, ctx->errstr, address.str()});
  }
  redisEnableKeepAlive(ctx.get());
  // AUTH and SELECT get the connect timeout too: they are part of connecting.
  redisSetTimeout(ctx.get(), to_timeval(settings.connect_timeout));
  Connection conn(std::move(ctx), address);
  // A refusal is reported as "AUTH: <the server's error>" (or "SELECT: ..."): handshake_refusal
  // reads that form back.
  auto handshake = [&](std::vector<std::string> args) -> std::expected<void, Failure> {
    auto reply = conn.call(args);
    if (!reply) {
      Failure f = reply.error();
      f.kind = f.kind == Failure::Kind::timeout ? Failure::Kind::connect_timeout : Failure::Kind::connect;
      return std::unexpected(f);
    }
    if (reply->is_error()) return std::unexpected(Failure{Failure::Kind::connect, args[0] + ": " + reply->str, address.str()});
    return {};
  };
  if (!settings.password.empty()) {
    std::vector<std::string> auth{"AUTH"};
    if (!settings.user.empty()) auth.push_back(settings.user);
    auth.push_back(settings.password);
    if (auto ok = handshake(std::move(auth)); !ok) return std::unexpected(ok.error());
  }
  if (settings.db != 0) {
    if (auto ok = handshake({"SELECT", std::to_string(settings.db)}); !ok) return std::unexpected(ok.error());
  }
  redisSetTimeout(conn.ctx_.get(), to_timeval(settings.command_timeout));
  if (nonblocking) {
    // What redisConnectNonBlock does: hiredis then treats EAGAIN as "try again later".
    conn.ctx_->flags &= ~REDIS_BLOCK;
    const int flags = fcntl(conn.ctx_->fd, F_GETFL);
    if (flags < 0 || fcntl(conn.ctx_->fd, F_SETFL, flags | O_NONBLOCK) < 0) {
      return std::unexpected(Failure{Failure::Kind::connect, std::strerror(errno), address.str()});
    }
  }
  return conn;
}

std::expected<Reply, Failure> Connection::call(const std::vector<std::string>& args) {
  append(args);
  void* raw = nullptr;
  int rc = REDIS_OK;
  int saved_errno = 0;
  {
    const SigpipeScope no_sigpipe;
    errno = 0;
    rc = redisGetReply(ctx_.get(), &raw);
    saved_errno = errno;
  }
  std::unique_ptr<void, FreeReply> owned(raw);
  if (rc != REDIS_OK || !raw) {
    if (ctx_->err == REDIS_ERR_PROTOCOL) return std::unexpected(failure(Failure::Kind::protocol));
    if (ctx_->err == REDIS_ERR_IO && timed_out(ctx_.get(), saved_errno)) {
      return std::unexpected(failure(Failure::Kind::timeout));
    }
    return std::unexpected(failure(Failure::Kind::io));
  }
  return convert(static_cast<redisReply*>(raw));
}

void Connection::append(const std::vector<std::string>& args) {
  constexpr std::size_t kInline = 16;
  const char* argv_inline[kInline];
  std::size_t lens_inline[kInline];
  std::vector<const char*> argv_heap;
  std::vector<std::size_t> lens_heap;
  const char** argv = argv_inline;
  std::size_t* lens = lens_inline;
  if (args.size() > kInline) {
    argv_heap.resize(args.size());
    lens_heap.resize(args.size());
    argv = argv_heap.data();
    lens = lens_heap.data();
  }
  for (std::size_t i = 0; i < args.size(); ++i) {
    argv[i] = args[i].data();
    lens[i] = args[i].size();
  }
  redisAppendCommandArgv(ctx_.get(), static_cast<int>(args.size()), argv, lens);
}

std::expected<bool, Failure> Connection::flush() {
  int done = 0;
  const SigpipeScope no_sigpipe;
  if (redisBufferWrite(ctx_.get(), &done) != REDIS_OK) return std::unexpected(failure(Failure::Kind::io));
  return done != 0;
}

std::expected<void, Failure> Connection::read() {
  if (redisBufferRead(ctx_.get()) != REDIS_OK) {
    return std::unexpected(failure(ctx_->err == REDIS_ERR_PROTOCOL ? Failure::Kind::protocol : Failure::Kind::io));
  }
  return {};
}

std::expected<std::optional<Reply>, Failure> Connection::next_reply() {
  void* raw = nullptr;
  if (redisGetReplyFromReader(ctx_.get(), &raw) != REDIS_OK) {
    return std::unexpected(failure(Failure::Kind::protocol));
  }
  if (!raw) return std::optional<Reply>{};
  std::unique_ptr<void, FreeReply> owned(raw);
  return std::optional<Reply>{convert(static_cast<redisReply*>(raw))};
}

}  // namespace idem::redis_detail
