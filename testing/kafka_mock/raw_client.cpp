#include "raw_client.hpp"

#include <unistd.h>

#include <array>
#include <atomic>
#include <stdexcept>
#include <utility>

namespace idem::kafka_raw {
namespace {

void quiet_log(const rd_kafka_t*, int, const char*, const char*) {}

std::atomic<int> names{0};

// A group no one else uses, for reads that must not touch a real group's state.
std::string private_group() { return "raw-reader-" + std::to_string(::getpid()) + "-" + std::to_string(++names); }

}  // namespace

void ConsumerDeleter::operator()(rd_kafka_t* rk) const {
  rd_kafka_consumer_close(rk);
  rd_kafka_destroy(rk);
}

Consumer consumer(const std::string& bootstrap, const std::string& group) {
  std::array<char, 512> err{};
  rd_kafka_conf_t* conf = rd_kafka_conf_new();
  const std::pair<const char*, std::string> props[] = {
      {"bootstrap.servers", bootstrap},
      {"group.id", group},
      {"enable.auto.commit", "false"},
      {"enable.auto.offset.store", "false"},
      {"auto.offset.reset", "earliest"},
  };
  for (const auto& [name, value] : props) {
    if (rd_kafka_conf_set(conf, name, value.c_str(), err.data(), err.size()) != RD_KAFKA_CONF_OK) {
      rd_kafka_conf_destroy(conf);
      throw std::runtime_error(std::string("raw consumer: ") + err.data());
    }
  }
  rd_kafka_conf_set_log_cb(conf, quiet_log);
  rd_kafka_t* rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, err.data(), err.size());
  if (rk == nullptr) {
    rd_kafka_conf_destroy(conf);
    throw std::runtime_error(std::string("raw consumer: ") + err.data());
  }
  rd_kafka_poll_set_consumer(rk);
  return Consumer(rk);
}

int partition_count(rd_kafka_t* rk, const std::string& topic) {
  rd_kafka_topic_t* rkt = rd_kafka_topic_new(rk, topic.c_str(), nullptr);
  const rd_kafka_metadata_t* md = nullptr;
  const auto err = rd_kafka_metadata(rk, 0, rkt, &md, 10'000);
  rd_kafka_topic_destroy(rkt);
  if (err != RD_KAFKA_RESP_ERR_NO_ERROR) throw std::runtime_error("metadata for " + topic + ": " + rd_kafka_err2str(err));
  int n = 0;
  for (int i = 0; i < md->topic_cnt; ++i) {
    if (topic == md->topics[i].topic) n = md->topics[i].partition_cnt;
  }
  rd_kafka_metadata_destroy(md);
  if (n == 0) throw std::runtime_error("topic " + topic + " has no partitions (does it exist?)");
  return n;
}

std::map<std::int32_t, std::int64_t> watermarks(rd_kafka_t* rk, const std::string& topic) {
  std::map<std::int32_t, std::int64_t> out;
  const int n = partition_count(rk, topic);
  for (int p = 0; p < n; ++p) {
    std::int64_t low = 0, high = 0;
    const auto err = rd_kafka_query_watermark_offsets(rk, topic.c_str(), p, &low, &high, 10'000);
    if (err != RD_KAFKA_RESP_ERR_NO_ERROR) throw std::runtime_error("watermarks of " + topic + ": " + rd_kafka_err2str(err));
    out[p] = high;
  }
  return out;
}

namespace {

std::map<std::int32_t, std::int64_t> committed_offsets(rd_kafka_t* rk, const std::string& topic) {
  const int n = partition_count(rk, topic);
  PartitionList list(rd_kafka_topic_partition_list_new(n));
  for (int p = 0; p < n; ++p) rd_kafka_topic_partition_list_add(list.get(), topic.c_str(), p);
  if (const auto err = rd_kafka_committed(rk, list.get(), 10'000); err != RD_KAFKA_RESP_ERR_NO_ERROR) {
    throw std::runtime_error(std::string("committed offsets: ") + rd_kafka_err2str(err));
  }
  std::map<std::int32_t, std::int64_t> out;
  for (int i = 0; i < list->cnt; ++i) out[list->elems[i].partition] = list->elems[i].offset < 0 ? -1 : list->elems[i].offset;
  return out;
}

}  // namespace

std::map<std::int32_t, std::int64_t> committed_offsets(const std::string& bootstrap, const std::string& topic,
                                                       const std::string& group) {
  return committed_offsets(consumer(bootstrap, group).get(), topic);
}

// One client of the group reads both its committed offsets and the watermarks (it never joins:
// reading offsets leaves the group's members alone).
std::size_t uncommitted(const std::string& bootstrap, const std::string& topic, const std::string& group) {
  Consumer rk = consumer(bootstrap, group);
  const auto committed = committed_offsets(rk.get(), topic);
  std::size_t left = 0;
  for (const auto& [p, high] : watermarks(rk.get(), topic)) {
    const auto it = committed.find(p);
    const std::int64_t done = it == committed.end() || it->second < 0 ? 0 : it->second;
    if (high > done) left += static_cast<std::size_t>(high - done);
  }
  return left;
}

void create_topic(const std::string& bootstrap, const std::string& topic, int partitions) {
  Consumer rk = consumer(bootstrap, private_group());
  const rd_kafka_metadata_t* md = nullptr;
  if (const auto err = rd_kafka_metadata(rk.get(), 0, nullptr, &md, 10'000); err != RD_KAFKA_RESP_ERR_NO_ERROR) {
    throw std::runtime_error(std::string("metadata: ") + rd_kafka_err2str(err));
  }
  const int replication = md->broker_cnt < 3 ? md->broker_cnt : 3;
  rd_kafka_metadata_destroy(md);

  std::array<char, 512> errstr{};
  rd_kafka_NewTopic_t* request = rd_kafka_NewTopic_new(topic.c_str(), partitions, replication, errstr.data(), errstr.size());
  if (request == nullptr) throw std::runtime_error("topic " + topic + ": " + errstr.data());
  rd_kafka_queue_t* queue = rd_kafka_queue_new(rk.get());
  rd_kafka_CreateTopics(rk.get(), &request, 1, nullptr, queue);
  rd_kafka_NewTopic_destroy(request);
  rd_kafka_event_t* event = rd_kafka_queue_poll(queue, 30'000);
  std::string error;
  if (event == nullptr) {
    error = "no answer within 30 s";
  } else if (rd_kafka_event_error(event) != RD_KAFKA_RESP_ERR_NO_ERROR) {
    error = rd_kafka_event_error_string(event);
  } else {
    std::size_t n = 0;
    const rd_kafka_topic_result_t** results = rd_kafka_CreateTopics_result_topics(rd_kafka_event_CreateTopics_result(event), &n);
    for (std::size_t i = 0; i < n; ++i) {
      const auto err = rd_kafka_topic_result_error(results[i]);
      if (err != RD_KAFKA_RESP_ERR_NO_ERROR && err != RD_KAFKA_RESP_ERR_TOPIC_ALREADY_EXISTS) {
        error = rd_kafka_topic_result_error_string(results[i]);
      }
    }
  }
  if (event != nullptr) rd_kafka_event_destroy(event);
  rd_kafka_queue_destroy(queue);
  if (!error.empty()) throw std::runtime_error("creating topic " + topic + ": " + error);
}

}  // namespace idem::kafka_raw
