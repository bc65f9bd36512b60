#pragma once

// Raw librdkafka calls on a cluster, for tests and for idem-kafka-mock's commands: a topic's
// partitions, their high watermarks, a group's committed offsets, what the group has not
// committed yet, and creating a topic through the admin API (on a real cluster). They throw
// std::runtime_error when the cluster does not answer.

#include <librdkafka/rdkafka.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>

namespace idem::kafka_raw {

struct ConsumerDeleter {
  void operator()(rd_kafka_t* rk) const;
};
/// A consumer handle that never subscribes: it only reads metadata and offsets, or is assigned.
using Consumer = std::unique_ptr<rd_kafka_t, ConsumerDeleter>;

struct ListDeleter {
  void operator()(rd_kafka_topic_partition_list_t* l) const { rd_kafka_topic_partition_list_destroy(l); }
};
using PartitionList = std::unique_ptr<rd_kafka_topic_partition_list_t, ListDeleter>;

/// A consumer of `group` (auto commits off, earliest offsets, its log silenced).
Consumer consumer(const std::string& bootstrap, const std::string& group);

/// How many partitions the topic has; throws when it has none.
int partition_count(rd_kafka_t* rk, const std::string& topic);

/// Each partition's high watermark (one past the last record).
std::map<std::int32_t, std::int64_t> watermarks(rd_kafka_t* rk, const std::string& topic);

/// The group's committed offset for each partition of the topic (-1: none).
std::map<std::int32_t, std::int64_t> committed_offsets(const std::string& bootstrap, const std::string& topic,
                                                       const std::string& group);

/// Records not yet committed by the group: the sum over partitions of high watermark minus the
/// committed offset (or minus 0 when none is committed).
std::size_t uncommitted(const std::string& bootstrap, const std::string& topic, const std::string& group);

/// Creates a topic with the admin API (CreateTopics), replication `min(3, brokers)`; a topic
/// that already exists is fine.
void create_topic(const std::string& bootstrap, const std::string& topic, int partitions);

}  // namespace idem::kafka_raw
