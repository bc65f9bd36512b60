#include "consumer_conf.hpp"

#include <utility>

namespace idem::kafka_detail {

BrokerResult<Conf> consumer_conf(const KafkaUrl& url, const std::string& client_id, Millis connect_timeout, Millis reconnect_min,
                                 Millis reconnect_max, ClientEvents& events) {
  auto conf = base_conf(url, client_id, connect_timeout, reconnect_min, reconnect_max, events);
  if (!conf) return conf;
  const auto ms = [](Millis m) { return std::to_string(m.count()); };
  const std::pair<const char*, std::string> props[] = {
      {"group.id", url.group},
      // Offsets move only when the source commits them: never past a message whose outcome is
      // durable yet (auto commit would commit what was merely fetched).
      {"enable.auto.commit", "false"},
      {"enable.auto.offset.store", "false"},
      {"auto.offset.reset", url.start_at_earliest ? "earliest" : "latest"},
      // range (eager), not cooperative-sticky: on librdkafka 2.0.2's mock cluster, which the
      // tests run on, cooperative-sticky fell into endless rebalances whenever the members did
      // not all land in the group's first generation (partitions moved back and forth for
      // minutes, each move a revocation and a commit with a stale generation). The source
      // handles both protocols (on_rebalance); cooperative-sticky is the better choice on a
      // real cluster, once tested there.
      {"partition.assignment.strategy", "range"},
      {"session.timeout.ms", ms(url.session_timeout)},
      {"heartbeat.interval.ms", ms(url.heartbeat_interval)},
      {"enable.partition.eof", "false"},
      {"allow.auto.create.topics", "false"},
      {"queued.min.messages", std::to_string(kFetchAheadRecords)},
      {"queued.max.messages.kbytes", std::to_string(kFetchAheadKbytes)},
  };
  for (const auto& [name, value] : props) {
    if (auto ok = set(conf->get(), name, value, events.where); !ok) return std::unexpected(ok.error());
  }
  return conf;
}

}  // namespace idem::kafka_detail
