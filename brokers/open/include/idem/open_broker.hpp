#pragma once

// Brokers opened by URL, like stores (idem/open_store.hpp): the one list of broker URL schemes,
// for idem-consume, idem-relay, idemctl and the examples.

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "idem/broker.hpp"

namespace idem {

/// Opens the source a URL names:
///   amqp://USER:PASS@HOST[:PORT]/VHOST?queue=NAME[&...]     RabbitMQ (brokers/amqp)
///   redis+stream://[[USER]:PASS@]HOST[:PORT]/STREAM?group=GROUP[&...]  Redis Streams
///   kafka://[USER:PASS@]HOST[:PORT][,HOST[:PORT]...]/TOPIC?group=GROUP[&...]  Kafka (brokers/kafka)
///   sqs+https://[KEY_ID:SECRET@]HOST[:PORT]/ACCOUNT/QUEUE[?...]   SQS (brokers/sqs; sqs+http:// too)
/// (docs/idem-consume.md and docs/consumers.md list every parameter). Errors never echo a password.
/// `on_warning` hears what a source notices on its own (stream entries trimmed before they were
/// acked, a consumer group recreated); optional.
BrokerResult<std::unique_ptr<MessageSource>> open_source(std::string_view url, const SourceSettings& settings,
                                                         std::function<void(std::string_view)> on_warning = {});

/// Opens the sink a URL names:
///   amqp://USER:PASS@HOST[:PORT]/VHOST?exchange=E[&routing_key=K]
///   redis+stream://[[USER]:PASS@]HOST[:PORT]/STREAM
///   kafka://[USER:PASS@]HOST[:PORT][,HOST[:PORT]...]/TOPIC
///   sqs+https://[KEY_ID:SECRET@]HOST[:PORT]/ACCOUNT/QUEUE[?...]
BrokerResult<std::unique_ptr<MessageSink>> open_sink(std::string_view url, const SinkSettings& settings);

/// Checks a source URL's form without connecting: nullopt when valid, else one line saying why.
std::optional<std::string> check_source_url(std::string_view url);
/// The same for a sink URL.
std::optional<std::string> check_sink_url(std::string_view url);

/// What a source URL consumes from, as a consumer name: the queue ("payments"), or the stream
/// or topic and group ("events/receipts"). For the records' tenant when no name is configured.
std::string source_identity(std::string_view url);

}  // namespace idem
