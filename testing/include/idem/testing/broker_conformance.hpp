#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "idem/broker.hpp"

namespace idem::testing {

/// A message found in the dead-letter queue or stream, as the conformance suite checks it.
struct DeadLetter {
  std::string message_id;
  std::string body;
  std::string reason;      ///< DeadLetterReason::reason as the broker module wrote it
  std::string last_error;  ///< DeadLetterReason::last_error
};

/// One broker's queue (or stream and group) under test, made fresh for each test.
class BrokerUnderTest {
 public:
  virtual ~BrokerUnderTest() = default;
  /// A sink publishing to the queue or stream under test.
  virtual std::unique_ptr<MessageSink> sink() = 0;
  /// A source consuming it (the same queue, or the same consumer group), with these settings;
  /// every source of one test competes for the same messages.
  virtual std::unique_ptr<MessageSource> source(const SourceSettings& settings) = 0;
  /// What the dead-letter queue or stream holds now, taken out of it.
  virtual std::vector<DeadLetter> take_dead_letters() = 0;
  /// Messages of the queue or stream not yet acknowledged (delivered or not), once every source
  /// of the test is gone: 0 when everything was consumed and acknowledged.
  virtual std::size_t outstanding() = 0;
  /// Stops the broker and starts it again, its data kept; returns once it accepts connections.
  /// Only the restart suite calls it.
  virtual void restart_broker() = 0;
  /// How long consumers that just started need before the broker has shared the messages out
  /// among them for good: a Kafka group's rebalance. A test that counts dead letters exactly
  /// publishes only then (a rebalance between a dead letter and its commit delivers the message
  /// again to the partition's next owner, which dead-letters it a second time).
  virtual std::chrono::milliseconds settle_time() { return std::chrono::milliseconds(0); }
};

/// How the suite obtains queues of one broker.
struct BrokerFactory {
  std::string name;  ///< shown in test names: "amqp", "redis_streams"
  std::function<std::unique_ptr<BrokerUnderTest>()> make;
};

inline void PrintTo(const BrokerFactory& factory, std::ostream* os) { *os << factory.name; }

/// The suite every broker module passes (SPEC §10) with a real server: the same id published
/// twice has one effect; the unacknowledged deliveries of a consumer that died come back and
/// run once; competing consumers; poison messages; missing and invalid ids; oversized bodies.
/// Instantiate it in the module's live test and link `idem::broker_conformance`:
///   INSTANTIATE_TEST_SUITE_P(Amqp, BrokerConformance, ::testing::Values(BrokerFactory{...}),
///                            BrokerConformance::name_of);
class BrokerConformance : public ::testing::TestWithParam<BrokerFactory> {
 public:
  static std::string name_of(const ::testing::TestParamInfo<BrokerFactory>& info) { return info.param.name; }
};

/// The broker restarted mid-stream (restart_broker): nothing lost, nothing run twice. Its own
/// suite, so that a module can run it alone (it stops a server other tests may share).
class BrokerRestartConformance : public ::testing::TestWithParam<BrokerFactory> {
 public:
  static std::string name_of(const ::testing::TestParamInfo<BrokerFactory>& info) { return info.param.name; }
};

}  // namespace idem::testing
