#pragma once

// An idempotent producer that publishes a batch and waits for each record's delivery report:
// the sink's, and the source's for its dead letters. Private to the module.

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "client.hpp"

namespace idem::kafka_detail {

/// One record to produce. Views: the caller keeps what they point at alive during produce().
struct Record {
  std::string_view topic;
  std::optional<std::string_view> key;  ///< nullopt: a null key (the partitioner spreads such records)
  std::vector<std::pair<std::string_view, std::string_view>> headers;
  std::string_view value;
};

/// How a Producer is opened.
struct ProducerOptions {
  std::string client_id;
  Millis connect_timeout = std::chrono::seconds(5);
  /// How long a record may wait for its delivery report (librdkafka's message.timeout.ms too).
  Millis confirm_timeout = std::chrono::seconds(10);
  /// Checked to exist when opening (empty: only that the cluster answers).
  std::string topic;
  std::string doing = "opening the producer";
};

class Producer {
 public:
  /// Creates the producer (enable.idempotence, acks=all) and checks the cluster.
  static BrokerResult<std::unique_ptr<Producer>> open(const KafkaUrl& url, std::string where, ProducerOptions options);
  ~Producer();
  Producer(const Producer&) = delete;
  Producer& operator=(const Producer&) = delete;

  /// Produces the records and waits for their delivery reports, up to confirm_timeout (and a
  /// second's grace for librdkafka's own timeout report, which knows whether a record was sent).
  /// One result per record, in order; no report in time is BrokerErrc::timeout, in doubt.
  std::vector<BrokerResult<Done>> produce(std::span<const Record> records);

  /// Checks that the cluster answers.
  BrokerResult<Done> ping();

  /// Whether librdkafka raised a fatal error: this producer can do nothing more; open another.
  bool broken() const { return events_.fatal.has_value(); }

 private:
  Producer(std::string where, ProducerOptions options);
  static void on_delivery(rd_kafka_t* rk, const rd_kafka_message_t* message, void* opaque);
  void delivered(const rd_kafka_message_t* message);

  ProducerOptions options_;
  ClientEvents events_;
  Handle rk_;
  // Records of the batch in flight awaiting their report: sequence number -> index in results_.
  // A report for a sequence not here belongs to an earlier batch that gave up on it: ignored.
  std::unordered_map<std::uint64_t, std::size_t> waiting_;
  std::vector<BrokerResult<Done>>* results_ = nullptr;
  std::span<const Record> records_;
  std::uint64_t next_sequence_ = 0;
};

}  // namespace idem::kafka_detail
