#include "connection.hpp"

#include <amqp_ssl_socket.h>
#include <amqp_tcp_socket.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstring>

#include "idem/private_file.hpp"
#include "message.hpp"

namespace idem::amqp_detail {
namespace {

timeval to_timeval(Millis d) {
  const auto ms = std::max<std::int64_t>(d.count(), 1);
  return timeval{static_cast<time_t>(ms / 1000), static_cast<suseconds_t>((ms % 1000) * 1000)};
}

// How long the broker may stay silent: 1.5 heartbeat intervals (connection.hpp says why).
std::chrono::milliseconds silence_limit(int interval_seconds) { return std::chrono::milliseconds(interval_seconds * 1500); }

// How often we send a heartbeat: every half interval (in milliseconds: seconds(1) / 2 is 0).
std::chrono::milliseconds heartbeat_period(int interval_seconds) { return std::chrono::milliseconds(interval_seconds * 500); }

int ms_until(Steady::time_point t, Steady::time_point now) {
  if (t <= now) return 0;
  const auto ms = std::chrono::ceil<std::chrono::milliseconds>(t - now).count();
  return static_cast<int>(std::min<std::int64_t>(ms, 60'000));
}

amqp_table_entry_t bool_entry(const char* key, bool value) {
  amqp_table_entry_t e{};
  e.key = amqp_cstring_bytes(key);
  e.value.kind = AMQP_FIELD_KIND_BOOLEAN;
  e.value.value.boolean = value ? 1 : 0;
  return e;
}

// The first certificate check that failed in this thread's handshake (amqp_socket_open runs it
// in the calling thread): librabbitmq keeps OpenSSL's verify result to itself.
thread_local std::string tls_verify_failure;

int record_verify_failure(int ok, X509_STORE_CTX* store) {
  if (!ok && tls_verify_failure.empty()) {
    const int err = X509_STORE_CTX_get_error(store);
    tls_verify_failure = std::string("certificate verify failed: ") + X509_verify_cert_error_string(err);
    if (X509* cert = X509_STORE_CTX_get_current_cert(store)) {
      char subject[256] = {};
      X509_NAME_oneline(X509_get_subject_name(cert), subject, sizeof subject - 1);
      tls_verify_failure += std::string(" (certificate ") + subject + ")";
    }
  }
  return ok;
}

// OpenSSL's reason for the latest failure (the queue emptied), or "".
std::string openssl_reason() {
  const unsigned long e = ERR_peek_last_error();
  std::string out;
  if (e != 0) {
    if (const char* reason = ERR_reason_error_string(e)) out = reason;
  }
  ERR_clear_error();
  return out;
}

int passphrase_callback(char* buffer, int size, int, void* user) {
  const auto* passphrase = static_cast<const std::string*>(user);
  // No passphrase: fail (OpenSSL's default would prompt on the terminal).
  if (passphrase == nullptr || passphrase->empty() || passphrase->size() > static_cast<std::size_t>(size)) return -1;
  std::memcpy(buffer, passphrase->data(), passphrase->size());
  return static_cast<int>(passphrase->size());
}

// Sets up `ctx` for e: TLS 1.2 or later, the broker's certificate verified (chain and host name,
// by OpenSSL, which also takes an IP address), the client certificate and key. Errors name the
// URL parameter and the file.
std::expected<void, std::string> configure_tls(SSL_CTX* ctx, const Endpoint& e) {
  ERR_clear_error();
  SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
  if (!e.ca_file.empty()) {
    if (SSL_CTX_load_verify_locations(ctx, e.ca_file.c_str(), nullptr) != 1) {
      const std::string why = openssl_reason();
      return std::unexpected("cacertfile=" + e.ca_file + ": cannot use it as CA certificates: " +
                             (why.empty() ? "not readable or not PEM" : why));
    }
  } else if (SSL_CTX_set_default_verify_paths(ctx) != 1) {
    return std::unexpected("cannot load the system's trust store: " + openssl_reason() + "; give cacertfile=");
  }
  X509_VERIFY_PARAM* param = SSL_CTX_get0_param(ctx);
  X509_VERIFY_PARAM_set_hostflags(param, X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS);
  in6_addr ip{};
  const bool is_ip = ::inet_pton(AF_INET, e.host.c_str(), &ip) == 1 || ::inet_pton(AF_INET6, e.host.c_str(), &ip) == 1;
  if ((is_ip ? X509_VERIFY_PARAM_set1_ip_asc(param, e.host.c_str()) : X509_VERIFY_PARAM_set1_host(param, e.host.c_str(), 0)) != 1) {
    return std::unexpected("cannot check the host name " + e.host + " against RabbitMQ's certificate");
  }
  SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, &record_verify_failure);

  if (e.cert_file.empty()) return {};
  if (SSL_CTX_use_certificate_chain_file(ctx, e.cert_file.c_str()) != 1) {
    const std::string why = openssl_reason();
    return std::unexpected("certfile=" + e.cert_file + ": cannot use it as the client certificate: " +
                           (why.empty() ? "not readable or not PEM" : why));
  }
  auto key = read_private_file(e.key_file, "key file (keyfile=)", std::size_t{1} << 20, "1 MiB");
  if (!key) return std::unexpected(key.error());
  std::string passphrase;
  if (!e.key_passphrase_file.empty()) {
    auto pass = read_private_file(e.key_passphrase_file, "passphrase file (passphrasefile=)", 4096, "4 KiB");
    if (!pass) {
      OPENSSL_cleanse(key->data(), key->size());
      return std::unexpected(pass.error());
    }
    passphrase.assign(*pass, 0, pass->find_first_of("\r\n"));
    OPENSSL_cleanse(pass->data(), pass->size());
  }
  BIO* bio = BIO_new_mem_buf(key->data(), static_cast<int>(key->size()));
  EVP_PKEY* pkey = bio ? PEM_read_bio_PrivateKey(bio, nullptr, &passphrase_callback, &passphrase) : nullptr;
  BIO_free(bio);
  OPENSSL_cleanse(key->data(), key->size());
  OPENSSL_cleanse(passphrase.data(), passphrase.size());
  if (pkey == nullptr) {
    const std::string why = openssl_reason();
    return std::unexpected("keyfile=" + e.key_file + ": cannot open the key: " + (why.empty() ? "not a PEM key" : why) +
                           (e.key_passphrase_file.empty() ? " (an encrypted key needs passphrasefile=)"
                                                          : " (is the passphrase right?)"));
  }
  const int used = SSL_CTX_use_PrivateKey(ctx, pkey);
  EVP_PKEY_free(pkey);
  if (used != 1 || SSL_CTX_check_private_key(ctx) != 1) {
    ERR_clear_error();
    return std::unexpected("keyfile=" + e.key_file + ": not the key of certfile=" + e.cert_file);
  }
  return {};
}

}  // namespace

Connection::Connection(Endpoint endpoint) : endpoint_(std::move(endpoint)) {}

Connection::~Connection() {
  if (state_ == nullptr) return;
  if (!dead_ && alive("closing")) {
    // A clean connection.close, so the broker requeues our unacked deliveries at once and logs
    // no "client unexpectedly closed TCP connection"; bounded, the broker may be the problem.
    const timeval tv{1, 0};
    amqp_set_rpc_timeout(state_, &tv);
    amqp_connection_close(state_, AMQP_REPLY_SUCCESS);
  }
  amqp_destroy_connection(state_);
}

Failure Connection::base_failure(std::string doing) const {
  Failure f;
  f.doing = std::move(doing);
  f.user = endpoint_.user;
  f.vhost = endpoint_.vhost;
  f.where = endpoint_.where;
  return f;
}

Failure Connection::library_failure(int status, std::string doing) {
  const int err = errno;
  Failure f = base_failure(std::move(doing));
  f.kind = Failure::Kind::library;
  f.status = status;
  // A non-blocking connect's EINPROGRESS is not the reason it failed.
  if (status == AMQP_STATUS_SOCKET_ERROR && err != EINPROGRESS && err != EAGAIN) f.sys_errno = err;
  // librabbitmq closes the socket itself after an RPC timeout or a failed send or read; a
  // connection that failed a call is not trusted with another.
  dead_ = true;
  return f;
}

std::expected<std::unique_ptr<Connection>, Failure> Connection::open(const Endpoint& endpoint) {
  std::unique_ptr<Connection> c(new Connection(endpoint));
  const std::string target = endpoint.host + ":" + std::to_string(endpoint.port);
  c->state_ = amqp_new_connection();
  if (c->state_ == nullptr) return std::unexpected(c->library_failure(AMQP_STATUS_NO_MEMORY, "connecting to " + target));
  amqp_socket_t* socket = endpoint.tls ? amqp_ssl_socket_new(c->state_) : amqp_tcp_socket_new(c->state_);
  if (socket == nullptr) return std::unexpected(c->library_failure(AMQP_STATUS_NO_MEMORY, "connecting to " + target));
  if (endpoint.tls) {
    // OpenSSL checks the chain and the host name (X509_VERIFY_PARAM); librabbitmq's own name
    // check reads DNS names only and would refuse a certificate for an IP address.
    amqp_ssl_socket_set_verify_peer(socket, 1);
    amqp_ssl_socket_set_verify_hostname(socket, 0);
    auto configured = configure_tls(static_cast<SSL_CTX*>(amqp_ssl_socket_get_context(socket)), endpoint);
    if (!configured) {
      Failure f = c->base_failure("setting up TLS to " + target);
      f.kind = Failure::Kind::tls_files;
      f.reply_text = std::move(configured.error());
      c->dead_ = true;
      return std::unexpected(std::move(f));
    }
  }

  const timeval tv = to_timeval(endpoint.connect_timeout);
  errno = 0;
  tls_verify_failure.clear();
  ERR_clear_error();
  if (const int st = amqp_socket_open_noblock(socket, endpoint.host.c_str(), endpoint.port, &tv); st != AMQP_STATUS_OK) {
    const std::string reason = endpoint.tls ? openssl_reason() : std::string();
    Failure f = c->library_failure(st, (endpoint.tls ? "TLS connecting to " : "connecting to ") + target);
    if (endpoint.tls) {
      f.tls_verify_failed = !tls_verify_failure.empty();
      f.tls_detail = f.tls_verify_failed ? tls_verify_failure : reason;
    }
    return std::unexpected(std::move(f));
  }
  amqp_set_handshake_timeout(c->state_, &tv);
  amqp_set_rpc_timeout(c->state_, &tv);

  // consumer_cancel_notify: a deleted queue cancels our consumer with basic.cancel instead of
  // silently ending the deliveries; connection.blocked: we hear about resource alarms.
  amqp_table_entry_t capabilities[] = {
      bool_entry("consumer_cancel_notify", true), bool_entry("connection.blocked", true),
      bool_entry("publisher_confirms", true),     bool_entry("basic.nack", true),
      bool_entry("authentication_failure_close", true),
  };
  amqp_table_entry_t properties[2]{};
  properties[0].key = amqp_cstring_bytes("connection_name");
  properties[0].value.kind = AMQP_FIELD_KIND_UTF8;
  properties[0].value.value.bytes = bytes_of(endpoint.connection_name);
  properties[1].key = amqp_cstring_bytes("capabilities");
  properties[1].value.kind = AMQP_FIELD_KIND_TABLE;
  properties[1].value.value.table = amqp_table_t{static_cast<int>(std::size(capabilities)), capabilities};
  const amqp_table_t client_properties{2, properties};

  const amqp_rpc_reply_t login = amqp_login_with_properties(
      c->state_, endpoint.vhost.c_str(), 0, AMQP_DEFAULT_FRAME_SIZE, static_cast<int>(endpoint.heartbeat.count()),
      &client_properties, AMQP_SASL_METHOD_PLAIN, endpoint.user.c_str(), endpoint.password.c_str());
  if (login.reply_type != AMQP_RESPONSE_NORMAL) {
    Failure f = c->base_failure("logging in to " + target);
    f.during_login = true;
    if (login.reply_type == AMQP_RESPONSE_LIBRARY_EXCEPTION) {
      f.kind = Failure::Kind::library;
      f.status = login.library_error;
      // TLS 1.3: a client certificate the broker refuses is told after the handshake, here.
      if (endpoint.tls) f.tls_detail = openssl_reason();
    } else if (login.reply_type == AMQP_RESPONSE_SERVER_EXCEPTION && login.reply.id == AMQP_CONNECTION_CLOSE_METHOD) {
      const auto* m = static_cast<const amqp_connection_close_t*>(login.reply.decoded);
      f.kind = Failure::Kind::connection_close;
      f.reply_code = m->reply_code;
      f.reply_text = string_of(m->reply_text);
      amqp_connection_close_ok_t ok{};
      amqp_send_method(c->state_, 0, AMQP_CONNECTION_CLOSE_OK_METHOD, &ok);
    } else {
      f.kind = Failure::Kind::protocol;
      f.reply_text = "an unexpected answer to the login";
    }
    c->dead_ = true;
    return std::unexpected(std::move(f));
  }
  c->last_heard_ = c->last_heartbeat_ = c->last_sent_ = Steady::now();
  if (auto opened = c->reopen_channel(); !opened) return std::unexpected(opened.error());
  return c;
}

std::uint32_t Connection::frame_max() const { return static_cast<std::uint32_t>(amqp_get_frame_max(state_)); }

std::expected<void, Failure> Connection::rpc_result(std::string doing) {
  const amqp_rpc_reply_t r = amqp_get_rpc_reply(state_);
  switch (r.reply_type) {
    case AMQP_RESPONSE_NORMAL:
      last_heard_ = last_sent_ = Steady::now();
      return {};
    case AMQP_RESPONSE_LIBRARY_EXCEPTION:
      return std::unexpected(library_failure(r.library_error, std::move(doing)));
    case AMQP_RESPONSE_SERVER_EXCEPTION: {
      Failure f = base_failure(std::move(doing));
      if (r.reply.id == AMQP_CHANNEL_CLOSE_METHOD) {
        const auto* m = static_cast<const amqp_channel_close_t*>(r.reply.decoded);
        f.kind = Failure::Kind::channel_close;
        f.reply_code = m->reply_code;
        f.reply_text = string_of(m->reply_text);
        amqp_channel_close_ok_t ok{};
        if (amqp_send_method(state_, kChannel, AMQP_CHANNEL_CLOSE_OK_METHOD, &ok) != AMQP_STATUS_OK) dead_ = true;
        channel_open_ = false;
      } else if (r.reply.id == AMQP_CONNECTION_CLOSE_METHOD) {
        const auto* m = static_cast<const amqp_connection_close_t*>(r.reply.decoded);
        f.kind = Failure::Kind::connection_close;
        f.reply_code = m->reply_code;
        f.reply_text = string_of(m->reply_text);
        amqp_connection_close_ok_t ok{};
        amqp_send_method(state_, 0, AMQP_CONNECTION_CLOSE_OK_METHOD, &ok);
        dead_ = true;
      } else {
        f.kind = Failure::Kind::protocol;
        f.reply_text = std::string("an unexpected ") + amqp_method_name(r.reply.id);
        dead_ = true;
      }
      return std::unexpected(std::move(f));
    }
    default: {
      Failure f = base_failure(std::move(doing));
      f.kind = Failure::Kind::protocol;
      f.reply_text = "no reply";
      dead_ = true;
      return std::unexpected(std::move(f));
    }
  }
}

std::expected<void, Failure> Connection::reopen_channel() {
  if (auto a = alive("opening a channel"); !a) return a;
  amqp_channel_open(state_, kChannel);
  if (auto r = rpc_result("opening a channel"); !r) return r;
  channel_open_ = true;
  return {};
}

std::expected<void, Failure> Connection::ensure_exchange(std::string_view name) {
  if (auto a = alive("declaring an exchange"); !a) return a;
  const std::string what = "exchange \"" + std::string(name) + "\"";
  // Passive first: an exchange someone made with another type or arguments is theirs to keep,
  // and an active declare of it would fail with PRECONDITION_FAILED.
  amqp_exchange_declare(state_, kChannel, bytes_of(name), amqp_cstring_bytes("direct"), 1, 0, 0, 0, amqp_empty_table);
  auto found = rpc_result("checking " + what);
  if (found || found.error().kind != Failure::Kind::channel_close || found.error().reply_code != AMQP_NOT_FOUND) return found;
  if (auto r = reopen_channel(); !r) return r;  // a failed passive declare closes the channel
  amqp_exchange_declare(state_, kChannel, bytes_of(name), amqp_cstring_bytes("direct"), 0, 1, 0, 0, amqp_empty_table);
  return rpc_result("declaring " + what);
}

std::expected<void, Failure> Connection::ensure_queue(std::string_view name, bool single_active_consumer) {
  if (auto a = alive("declaring a queue"); !a) return a;
  const std::string what = "queue \"" + std::string(name) + "\"";
  amqp_queue_declare(state_, kChannel, bytes_of(name), 1, 0, 0, 0, amqp_empty_table);
  auto found = rpc_result("checking " + what);
  if (found || found.error().kind != Failure::Kind::channel_close || found.error().reply_code != AMQP_NOT_FOUND) return found;
  if (auto r = reopen_channel(); !r) return r;
  amqp_table_entry_t single{};
  single.key = amqp_cstring_bytes("x-single-active-consumer");
  single.value.kind = AMQP_FIELD_KIND_BOOLEAN;
  single.value.value.boolean = 1;
  const amqp_table_t arguments = single_active_consumer ? amqp_table_t{1, &single} : amqp_empty_table;
  amqp_queue_declare(state_, kChannel, bytes_of(name), 0, 1, 0, 0, arguments);
  return rpc_result("declaring " + what);
}

std::expected<void, Failure> Connection::bind(std::string_view queue, std::string_view exchange, std::string_view key) {
  if (auto a = alive("binding a queue"); !a) return a;
  amqp_queue_bind(state_, kChannel, bytes_of(queue), bytes_of(exchange), bytes_of(key), amqp_empty_table);
  return rpc_result("binding queue \"" + std::string(queue) + "\" to exchange \"" + std::string(exchange) + "\"");
}

std::expected<void, Failure> Connection::qos(std::uint16_t prefetch) {
  if (auto a = alive("setting the prefetch (basic.qos)"); !a) return a;
  amqp_basic_qos(state_, kChannel, 0, prefetch, 0);
  return rpc_result("setting the prefetch (basic.qos)");
}

std::expected<void, Failure> Connection::confirm_select() {
  if (auto a = alive("enabling publisher confirms"); !a) return a;
  amqp_confirm_select(state_, kChannel);
  return rpc_result("enabling publisher confirms");
}

std::expected<void, Failure> Connection::consume(std::string_view queue, std::string_view consumer_tag) {
  if (auto a = alive("consuming"); !a) return a;
  amqp_basic_consume(state_, kChannel, bytes_of(queue), bytes_of(consumer_tag), 0, 0, 0, amqp_empty_table);
  return rpc_result("consuming from queue \"" + std::string(queue) + "\"");
}

std::expected<void, Failure> Connection::send(amqp_method_number_t id, void* method, std::string doing) {
  if (auto a = alive(doing); !a) return a;
  if (const int st = amqp_send_method(state_, kChannel, id, method); st != AMQP_STATUS_OK) {
    return std::unexpected(library_failure(st, std::move(doing)));
  }
  note_sent();
  return {};
}

std::expected<bool, Failure> Connection::next_frame(amqp_frame_t& frame) {
  for (;;) {
    if (dead_) return std::unexpected(library_failure(AMQP_STATUS_SOCKET_CLOSED, "reading from RabbitMQ"));
    timeval zero{0, 0};
    const int st = amqp_simple_wait_frame_noblock(state_, &frame, &zero);
    if (st == AMQP_STATUS_TIMEOUT) return false;
    if (st != AMQP_STATUS_OK) return std::unexpected(library_failure(st, "reading from RabbitMQ"));
    last_heard_ = Steady::now();
    if (frame.channel == kChannel) return true;
    if (frame.channel == 0 && frame.frame_type == AMQP_FRAME_METHOD) {
      switch (frame.payload.method.id) {
        case AMQP_CONNECTION_CLOSE_METHOD: {
          const auto* m = static_cast<const amqp_connection_close_t*>(frame.payload.method.decoded);
          Failure f = base_failure("");
          f.kind = Failure::Kind::connection_close;
          f.reply_code = m->reply_code;
          f.reply_text = string_of(m->reply_text);
          amqp_connection_close_ok_t ok{};
          amqp_send_method(state_, 0, AMQP_CONNECTION_CLOSE_OK_METHOD, &ok);
          dead_ = true;
          release();
          return std::unexpected(std::move(f));
        }
        case AMQP_CONNECTION_BLOCKED_METHOD: {
          const auto* m = static_cast<const amqp_connection_blocked_t*>(frame.payload.method.decoded);
          blocked_ = true;
          blocked_reason_ = string_of(m->reason);
          break;
        }
        case AMQP_CONNECTION_UNBLOCKED_METHOD:
          blocked_ = false;
          blocked_reason_.clear();
          break;
        default:
          break;  // nothing else comes on channel 0 once the connection is open
      }
    }
    release();
  }
}

Failure Connection::channel_closed(const amqp_frame_t& frame, std::string doing) {
  const auto* m = static_cast<const amqp_channel_close_t*>(frame.payload.method.decoded);
  Failure f = base_failure(std::move(doing));
  f.kind = Failure::Kind::channel_close;
  f.reply_code = m->reply_code;
  f.reply_text = string_of(m->reply_text);
  release();
  amqp_channel_close_ok_t ok{};
  if (amqp_send_method(state_, kChannel, AMQP_CHANNEL_CLOSE_OK_METHOD, &ok) != AMQP_STATUS_OK) dead_ = true;
  channel_open_ = false;
  return f;
}

std::chrono::milliseconds Connection::silence() const {
  // The kernel knows when bytes last arrived, whoever read them and whether anyone did yet
  // (librabbitmq reads heartbeats without telling us). Our own record is the fallback.
  tcp_info info{};
  socklen_t len = sizeof info;
  const int fd = amqp_get_sockfd(state_);
  if (::getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &len) == 0 &&
      len >= offsetof(tcp_info, tcpi_last_data_recv) + sizeof info.tcpi_last_data_recv) {
    return std::chrono::milliseconds(info.tcpi_last_data_recv);
  }
  // Without it, bytes waiting unread count as just heard.
  pollfd p{fd, POLLIN, 0};
  if (::poll(&p, 1, 0) > 0) return std::chrono::milliseconds(0);
  return std::chrono::duration_cast<std::chrono::milliseconds>(Steady::now() - last_heard_);
}

std::expected<void, Failure> Connection::alive(const std::string& doing) {
  if (dead_) return std::unexpected(library_failure(AMQP_STATUS_SOCKET_CLOSED, doing));
  const int interval = amqp_get_heartbeat(state_);
  if (interval <= 0) return {};
  if (silence() <= silence_limit(interval)) return {};
  Failure f = base_failure(doing);
  f.kind = Failure::Kind::heartbeat;
  dead_ = true;
  return std::unexpected(std::move(f));
}

std::expected<void, Failure> Connection::keep_alive() {
  if (auto a = alive(""); !a) return a;
  const int interval = amqp_get_heartbeat(state_);
  if (interval <= 0) return {};
  const auto now = Steady::now();
  if (now - last_heartbeat_ >= heartbeat_period(interval)) {
    amqp_frame_t heartbeat{};
    heartbeat.frame_type = AMQP_FRAME_HEARTBEAT;
    heartbeat.channel = 0;
    if (const int st = amqp_send_frame(state_, &heartbeat); st != AMQP_STATUS_OK) {
      return std::unexpected(library_failure(st, "sending a heartbeat"));
    }
    last_heartbeat_ = last_sent_ = now;
  }
  return {};
}

std::expected<Connection::Wait, Failure> Connection::wait(Steady::time_point until, int wake_fd) {
  for (;;) {
    // Frames librabbitmq holds already (queued by an RPC, or read with an earlier recv) never
    // make the socket readable again: poll() would sleep on data we have.
    if (amqp_frames_enqueued(state_) || amqp_data_in_buffer(state_)) return Wait::readable;
    if (auto alive = keep_alive(); !alive) return std::unexpected(alive.error());
    const auto now = Steady::now();
    int timeout = ms_until(until, now);
    if (const int interval = amqp_get_heartbeat(state_); interval > 0) {
      // Wake up for the next heartbeat to send, and to notice the broker's silence.
      timeout = std::min(timeout, ms_until(last_heartbeat_ + heartbeat_period(interval), now));
      timeout = std::min(timeout, ms_until(now + silence_limit(interval) - silence() + std::chrono::milliseconds(1), now));
    }
    pollfd fds[2] = {{amqp_get_sockfd(state_), POLLIN, 0}, {wake_fd, POLLIN, 0}};
    const nfds_t count = wake_fd >= 0 ? 2 : 1;
    const int n = ::poll(fds, count, timeout);
    if (n < 0) {
      if (errno == EINTR) continue;
      return std::unexpected(library_failure(AMQP_STATUS_SOCKET_ERROR, "waiting for RabbitMQ"));
    }
    if (count == 2 && (fds[1].revents & POLLIN)) return Wait::woken;
    if (fds[0].revents & (POLLIN | POLLHUP | POLLERR)) {
      last_heard_ = Steady::now();
      return Wait::readable;
    }
    if (Steady::now() >= until) return Wait::timeout;
  }
}

std::expected<bool, Failure> Connection::wait_writable(Steady::time_point until) {
  for (;;) {
    pollfd p{amqp_get_sockfd(state_), POLLOUT, 0};
    const int n = ::poll(&p, 1, ms_until(until, Steady::now()));
    if (n < 0) {
      if (errno == EINTR) continue;
      return std::unexpected(library_failure(AMQP_STATUS_SOCKET_ERROR, "waiting to publish"));
    }
    if (n > 0) {
      if (p.revents & (POLLERR | POLLHUP)) return std::unexpected(library_failure(AMQP_STATUS_SOCKET_ERROR, "publishing"));
      return true;
    }
    if (Steady::now() >= until) return false;
  }
}

}  // namespace idem::amqp_detail
