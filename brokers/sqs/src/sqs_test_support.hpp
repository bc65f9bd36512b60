#pragma once

// For the live tests: fauxqs (testing/sqs_emulator/serve.mjs) started as a child process on a
// loopback port, an API client for what the tests do besides the module (creating queues,
// counting and reading messages), and the AWS SDK producer (testing/sqs_emulator/produce.mjs).

#include <sys/types.h>

#include <cstddef>
#include <map>
#include <string>
#include <vector>

#include "client.hpp"
#include "protocol.hpp"

namespace idem::sqs_test {

/// The credentials and region every test uses (fauxqs checks no signature; the unit test checks
/// curl's).
inline constexpr const char* kKeyId = "AKIAIDEMTEST0000";
inline constexpr const char* kSecret = "idem-test-secret-Zq9xW";
inline constexpr const char* kRegion = "us-east-1";
inline constexpr const char* kAccount = "000000000000";

/// A fauxqs process on 127.0.0.1. Throws std::runtime_error, saying what to do, when node or
/// testing/sqs_emulator/node_modules is missing or the emulator does not come up.
class Emulator {
 public:
  Emulator();
  /// Stops it (SIGTERM, then SIGKILL after 5 s) and removes its temp dir.
  ~Emulator();
  Emulator(const Emulator&) = delete;
  Emulator& operator=(const Emulator&) = delete;

  int port() const { return port_; }
  /// "http://127.0.0.1:PORT/"
  std::string endpoint() const;
  /// Kills it now (SIGKILL): the endpoint goes away, and with it every queue and message.
  void kill();
  /// Starts it again on the same port (fauxqs keeps nothing: queues must be created again).
  void start_again();

  /// The emulator this test process shares, started on first use.
  static Emulator& shared();

 private:
  void start(int port);
  void wait_until_stopped();

  pid_t pid_ = -1;
  std::string dir_;
  int port_ = 0;
};

/// A name no other test of this process uses: PREFIX-PID-N.
std::string unique_name(const std::string& prefix);

/// What the tests ask the emulator directly, through the module's own client.
class Api {
 public:
  explicit Api(const Emulator& emulator);

  /// "http://127.0.0.1:PORT/000000000000/NAME"
  std::string queue_url(const std::string& name) const;
  /// "sqs+http://KEY:SECRET@127.0.0.1:PORT/000000000000/NAME?region=us-east-1" + `parameters`
  /// ("&visibility_timeout=2", ...).
  std::string url(const std::string& name, const std::string& parameters = "") const;

  /// CreateQueue (FIFO when the name ends in .fifo); throws on failure.
  void create_queue(const std::string& name, const std::map<std::string, std::string>& attributes = {});
  /// Visible, in flight and delayed messages: ApproximateNumberOfMessages(+NotVisible,+Delayed).
  std::size_t outstanding(const std::string& name);
  /// Every visible message, received (with all attributes) and deleted.
  std::vector<sqs_detail::ReceivedMessage> take_all(const std::string& name);
  /// One ReceiveMessage without waiting, not deleted (its visibility: `visibility` seconds).
  std::vector<sqs_detail::ReceivedMessage> peek(const std::string& name, int visibility = 0);
  /// GetQueueAttributes "All".
  std::map<std::string, std::string> attributes(const std::string& name);

 private:
  sqs_detail::Reply call(const std::string& action, const std::string& body);

  int port_;
  sqs_detail::Client client_;
};

/// A line for produce.mjs.
struct SdkMessage {
  std::string body;
  std::string id;  ///< empty: no message_id attribute
  std::string content_type;
  std::string group;  ///< FIFO
  std::string dedup;  ///< FIFO; empty: the id
  std::map<std::string, std::string> attributes;
};

/// Sends the messages with the AWS SDK (node produce.mjs QUEUE_URL); throws unless it exits 0.
void sdk_produce(const std::string& queue_url, const std::vector<SdkMessage>& messages);

}  // namespace idem::sqs_test
