#include "idem/open_broker.hpp"

#include "idem/amqp_broker.hpp"
#include "idem/kafka_broker.hpp"
#include "idem/redact.hpp"
#include "idem/redis_stream_broker.hpp"
#include "idem/sqs_broker.hpp"

namespace idem {
namespace {

enum class Scheme { amqp, redis_stream, kafka, sqs, unknown };

Scheme scheme_of(std::string_view url) {
  if (url.starts_with("amqp://") || url.starts_with("amqps://")) return Scheme::amqp;
  if (url.starts_with("redis+stream://")) return Scheme::redis_stream;
  if (url.starts_with("kafka://")) return Scheme::kafka;
  if (url.starts_with("sqs+https://") || url.starts_with("sqs+http://")) return Scheme::sqs;
  return Scheme::unknown;
}

std::string unknown(std::string_view url) {
  // redact_kafka_url: redact_url and the two password parameters librdkafka's names use.
  return "unknown broker URL \"" + redact_kafka_url(url) +
         "\"; expected amqp[s]://USER:PASS@HOST:PORT/VHOST?..., redis+stream://HOST:PORT/STREAM?..., "
         "kafka://HOST:PORT[,HOST:PORT...]/TOPIC?... or sqs+https://HOST/ACCOUNT_ID/QUEUE?...";
}

BrokerError invalid(std::string message) { return BrokerError{BrokerErrc::invalid, std::move(message), false}; }

}  // namespace

BrokerResult<std::unique_ptr<MessageSource>> open_source(std::string_view url, const SourceSettings& settings,
                                                         std::function<void(std::string_view)> on_warning) {
  switch (scheme_of(url)) {
    case Scheme::amqp:
      return open_amqp_source(url, settings);
    case Scheme::redis_stream:
      return open_redis_stream_source(url, settings, RedisStreamEvents{std::move(on_warning)});
    case Scheme::kafka:
      return open_kafka_source(url, settings, KafkaEvents{std::move(on_warning)});
    case Scheme::sqs:
      return open_sqs_source(url, settings, SqsEvents{std::move(on_warning)});
    case Scheme::unknown:
      break;
  }
  return std::unexpected(invalid(unknown(url)));
}

BrokerResult<std::unique_ptr<MessageSink>> open_sink(std::string_view url, const SinkSettings& settings) {
  switch (scheme_of(url)) {
    case Scheme::amqp:
      return open_amqp_sink(url, settings);
    case Scheme::redis_stream:
      return open_redis_stream_sink(url, settings);
    case Scheme::kafka:
      return open_kafka_sink(url, settings);
    case Scheme::sqs:
      return open_sqs_sink(url, settings);
    case Scheme::unknown:
      break;
  }
  return std::unexpected(invalid(unknown(url)));
}

std::optional<std::string> check_source_url(std::string_view url) {
  switch (scheme_of(url)) {
    case Scheme::amqp:
      if (auto parsed = parse_amqp_url(url, AmqpUrlRole::source); !parsed) return parsed.error().message;
      return std::nullopt;
    case Scheme::redis_stream:
      if (auto parsed = parse_redis_stream_url(url, RedisStreamRole::source); !parsed) return parsed.error().message;
      return std::nullopt;
    case Scheme::kafka:
      if (auto parsed = parse_kafka_url(url, KafkaUrlRole::source); !parsed) return parsed.error().message;
      return std::nullopt;
    case Scheme::sqs:
      if (auto parsed = parse_sqs_url(url, SqsUrlRole::source); !parsed) return parsed.error().message;
      return std::nullopt;
    case Scheme::unknown:
      break;
  }
  return unknown(url);
}

std::optional<std::string> check_sink_url(std::string_view url) {
  switch (scheme_of(url)) {
    case Scheme::amqp:
      if (auto parsed = parse_amqp_url(url, AmqpUrlRole::sink); !parsed) return parsed.error().message;
      return std::nullopt;
    case Scheme::redis_stream:
      if (auto parsed = parse_redis_stream_url(url, RedisStreamRole::sink); !parsed) return parsed.error().message;
      return std::nullopt;
    case Scheme::kafka:
      if (auto parsed = parse_kafka_url(url, KafkaUrlRole::sink); !parsed) return parsed.error().message;
      return std::nullopt;
    case Scheme::sqs:
      if (auto parsed = parse_sqs_url(url, SqsUrlRole::sink); !parsed) return parsed.error().message;
      return std::nullopt;
    case Scheme::unknown:
      break;
  }
  return unknown(url);
}

std::string source_identity(std::string_view url) {
  switch (scheme_of(url)) {
    case Scheme::amqp:
      if (auto parsed = parse_amqp_url(url, AmqpUrlRole::source)) return parsed->queue;
      break;
    case Scheme::redis_stream:
      if (auto parsed = parse_redis_stream_url(url, RedisStreamRole::source)) return parsed->stream + "/" + parsed->group;
      break;
    case Scheme::kafka:
      if (auto parsed = parse_kafka_url(url, KafkaUrlRole::source)) return parsed->topic + "/" + parsed->group;
      break;
    case Scheme::sqs:
      if (auto parsed = parse_sqs_url(url, SqsUrlRole::source)) return parsed->queue;
      break;
    case Scheme::unknown:
      break;
  }
  return {};
}

}  // namespace idem
