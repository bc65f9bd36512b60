#pragma once

// One AMQP connection (librabbitmq's connection state and TCP socket), the RPCs idem uses on
// it, and a frame reader that never blocks.
//
// How frames are read, and why not with librabbitmq's consume helpers: librabbitmq 0.11 reads
// whatever frame comes next on the socket. Functions that want one channel's frame
// (amqp_simple_rpc, amqp_simple_wait_frame_on_channel) put other channels' frames on an
// internal queue. amqp_simple_wait_frame_on_channel, which amqp_read_message (and so
// amqp_consume_message) uses for a message's header and body, takes the first queued frame of
// its channel by setting the queue's head to the frame after it: every queued frame of another
// channel in front of it is dropped. amqp_consume_message also hands back a frame that is not
// a basic.deliver as AMQP_STATUS_UNEXPECTED_STATE, leaving it for the caller, and its
// amqp_read_message blocks without a deadline, beyond the reach of wake(). So:
//  - each connection carries one channel (1) besides channel 0: a source's deliveries on one
//    connection, its dead-letter publishes (confirm mode) on a connection of their own, a sink
//    on its own. Confirms never meet deliveries in librabbitmq's queue, and RabbitMQ's flow
//    control, which blocks a connection that publishes, never stops a consumer's acks;
//  - frames are taken only with amqp_simple_wait_frame_noblock and a zero timeout, which pops
//    the queue's head (nothing skipped) before it reads the socket, and messages are put back
//    together here (Assembler), so a half-read message simply waits for its next frames;
//  - waiting is poll() on the socket (and the source's eventfd), after checking that
//    librabbitmq holds no frame already (amqp_frames_enqueued, amqp_data_in_buffer): those
//    would never make the socket readable again.
// Heartbeats are sent here, every half interval, since librabbitmq sends them only while one
// of its own calls waits.
//
// Silence from the broker for 1.5 intervals (RabbitMQ sends a heartbeat every half interval:
// three missed) is a dead connection, and nothing is sent on it after that. Not only because it
// is dead: librabbitmq 0.11's send path (amqp_send_frame_inner, amqp_basic_publish), once its
// own receive deadline of two intervals has passed, calls amqp_try_recv, which in 0.11 waits for
// a byte with no deadline at all (amqp_time_s_from_now(&t, 0) is "infinite"). A send to a
// silent peer would block forever; checking first (alive()) keeps every send ahead of that.

#include <amqp.h>
#include <amqp_framing.h>
#include <amqp_tcp_socket.h>

#include <chrono>
#include <cstdint>
#include <expected>
#include <memory>
#include <string>
#include <string_view>

#include "errors.hpp"
#include "idem/clock.hpp"

namespace idem::amqp_detail {

using Steady = std::chrono::steady_clock;

/// Where and how to connect.
struct Endpoint {
  std::string host;
  int port = 5672;
  std::string user;
  std::string password;
  std::string vhost = "/";
  std::chrono::seconds heartbeat{30};
  Millis connect_timeout{5000};
  /// Shown by RabbitMQ (rabbitmqctl list_connections client_properties, the management UI).
  std::string connection_name;
  /// The redacted URL, prefixed to error messages.
  std::string where;
  /// amqps://: TLS, verified against ca_file (or the system's trust store), with a client
  /// certificate when cert_file is set (AmqpUrl says more).
  bool tls = false;
  std::string ca_file;
  std::string cert_file;
  std::string key_file;
  std::string key_passphrase_file;
};

/// The channel every idem connection uses.
inline constexpr amqp_channel_t kChannel = 1;

/// An open, logged-in AMQP connection. Closes itself (connection.close, then the socket) when
/// destroyed.
class Connection {
 public:
  /// Connects (TCP within connect_timeout), logs in and opens channel kChannel.
  static std::expected<std::unique_ptr<Connection>, Failure> open(const Endpoint& endpoint);
  ~Connection();
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  amqp_connection_state_t state() const { return state_; }
  /// The socket broke or the broker closed the connection: only destroying it is left.
  bool dead() const { return dead_; }
  /// The broker blocks this connection's publishes (a memory or disk alarm), and why.
  bool blocked() const { return blocked_; }
  const std::string& blocked_reason() const { return blocked_reason_; }
  /// The negotiated frame size.
  std::uint32_t frame_max() const;
  /// Whether the channel is open (a broker's channel.close closes it until reopen_channel()).
  bool channel_open() const { return channel_open_; }
  const Endpoint& endpoint() const { return endpoint_; }
  /// The negotiated heartbeat interval (0: none).
  std::chrono::seconds heartbeat() const { return std::chrono::seconds(amqp_get_heartbeat(state_)); }
  /// When we last sent the broker anything: it takes a connection silent for two intervals as
  /// dead. Publishes are counted by whoever makes them (note_sent).
  Steady::time_point last_sent() const { return last_sent_; }
  void note_sent() { last_sent_ = Steady::now(); }

  /// Opens kChannel again after the broker closed it.
  std::expected<void, Failure> reopen_channel();
  /// Declares a durable direct exchange unless one of that name exists.
  std::expected<void, Failure> ensure_exchange(std::string_view name);
  /// Declares a durable queue unless one of that name exists (whatever its arguments).
  std::expected<void, Failure> ensure_queue(std::string_view name, bool single_active_consumer = false);
  /// Binds a queue to an exchange for a routing key (idempotent).
  std::expected<void, Failure> bind(std::string_view queue, std::string_view exchange, std::string_view key);
  /// basic.qos: at most `prefetch` unacknowledged deliveries on the channel. Also a cheap round
  /// trip for ping().
  std::expected<void, Failure> qos(std::uint16_t prefetch);
  /// Puts the channel in confirm mode.
  std::expected<void, Failure> confirm_select();
  /// Starts consuming `queue` with manual acks.
  std::expected<void, Failure> consume(std::string_view queue, std::string_view consumer_tag);

  /// Sends a method without waiting (basic.ack, basic.reject). Fails when the socket does.
  std::expected<void, Failure> send(amqp_method_number_t id, void* method, std::string doing);

  /// The next frame of kChannel, without blocking; false when there is none yet. Channel 0 is
  /// handled here (connection.close becomes the Failure, connection.blocked is recorded).
  std::expected<bool, Failure> next_frame(amqp_frame_t& frame);
  /// A frame's contents were copied: librabbitmq may reuse its memory.
  void release() { amqp_maybe_release_buffers(state_); }
  /// The Failure for a channel.close the broker sent on kChannel; answers it (close-ok), after
  /// which the channel may be opened again.
  Failure channel_closed(const amqp_frame_t& frame, std::string doing);

  enum class Wait : std::uint8_t { readable, woken, timeout };
  /// Waits until there is something to read (socket, or frames librabbitmq holds already),
  /// `wake_fd` (if >= 0) is readable, or `until` passes; keeps the connection alive meanwhile.
  std::expected<Wait, Failure> wait(Steady::time_point until, int wake_fd = -1);
  /// Waits until the socket takes more bytes, or `until` passes (false): a broker applying
  /// flow control stops reading, and librabbitmq would block in send() without a deadline.
  std::expected<bool, Failure> wait_writable(Steady::time_point until);
  /// Sends a heartbeat if half an interval passed without one, and fails if the broker has
  /// been silent for 1.5 intervals (see above). Cheap; call it whenever the connection might be
  /// idle, and before sending anything.
  std::expected<void, Failure> keep_alive();
  /// A Failure for a librabbitmq status, with errno for socket errors; marks the connection
  /// dead when the status means the socket is unusable.
  Failure library_failure(int status, std::string doing);

 private:
  explicit Connection(Endpoint endpoint);
  std::expected<void, Failure> rpc_result(std::string doing);
  /// Fails (and marks the connection dead) if it is dead or the broker has been silent too
  /// long and nothing waits to be read: every send and RPC starts with it.
  std::expected<void, Failure> alive(const std::string& doing);
  Failure base_failure(std::string doing) const;
  /// How long since bytes last came from the broker.
  std::chrono::milliseconds silence() const;

  Endpoint endpoint_;
  amqp_connection_state_t state_ = nullptr;
  bool dead_ = false;
  bool channel_open_ = false;
  bool blocked_ = false;
  std::string blocked_reason_;
  Steady::time_point last_heard_;  // when a frame or an answer last came (if TCP_INFO fails)
  Steady::time_point last_heartbeat_;
  Steady::time_point last_sent_;
};

}  // namespace idem::amqp_detail
