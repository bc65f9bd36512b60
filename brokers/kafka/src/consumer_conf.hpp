#pragma once

// The configuration of the source's consumer: the shared client settings plus the group's and
// what bounds the records librdkafka fetches ahead. Its own file so that the live test can check
// that bound on a consumer configured exactly like the source's.

#include <cstddef>
#include <string>

#include "client.hpp"

namespace idem::kafka_detail {

/// What librdkafka keeps fetched ahead of the source: records (`queued.min.messages`) and
/// kilobytes of them (`queued.max.messages.kbytes`), across the assigned partitions. Their queues
/// are all forwarded to one queue (source.cpp), whose length and size are what each partition's
/// fetch decision looks at; past either bound a partition is fetched again only once the queue
/// is below it, and one fetch response per partition can still arrive (at most
/// `max.partition.fetch.bytes`, 1 MiB). The kilobytes bound memory. The records bound is
/// librdkafka's default, and should stay high: librdkafka 2.0.2 looks at a partition held back by
/// it again only after up to a second, so a bound that a consumer drains within a second stalls
/// it for the rest of that second (8,192 held an in-process consumer to 19.5k records/s in
/// bursts and pauses; 100,000: 200k/s, bench/consumers).
constexpr std::size_t kFetchAheadRecords = 100000;
constexpr std::size_t kFetchAheadKbytes = 16384;

/// base_conf() plus the consumer group's settings from the URL: manual commits only, the
/// assignor, session and heartbeat timings, the fetch-ahead bounds above.
BrokerResult<Conf> consumer_conf(const KafkaUrl& url, const std::string& client_id, Millis connect_timeout, Millis reconnect_min,
                                 Millis reconnect_max, ClientEvents& events);

}  // namespace idem::kafka_detail
