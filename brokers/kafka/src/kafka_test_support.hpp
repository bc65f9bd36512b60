#pragma once

// For the live tests: idem-kafka-mock started as a child process (testing/kafka_mock), and raw
// librdkafka reads of what the module wrote (committed offsets, dead letters).

#include <sys/types.h>

#include <cstdint>
#include <cstdio>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "raw_client.hpp"

namespace idem::kafka_test {

/// An idem-kafka-mock process with its brokers on loopback ports it picked, under a temp dir.
class MockCluster {
 public:
  /// Starts it and waits for its port file; throws std::runtime_error when it does not come up.
  explicit MockCluster(int brokers = 3);
  /// Stops it by its pid (SIGTERM, then SIGKILL after 5 s) and removes the temp dir.
  ~MockCluster();
  MockCluster(const MockCluster&) = delete;
  MockCluster& operator=(const MockCluster&) = delete;

  /// "127.0.0.1:P1,127.0.0.1:P2,..."
  const std::string& bootstrap() const { return bootstrap_; }
  /// Sends one stdin command and returns its answer line ("ok", "error: ...").
  std::string command(const std::string& line);
  /// Creates a topic; throws unless the mock says ok.
  void create_topic(const std::string& name, int partitions);

  /// The cluster this test binary shares (3 brokers), started on first use.
  static MockCluster& shared();

 private:
  pid_t pid_ = -1;
  int to_child_ = -1;
  std::FILE* from_child_ = nullptr;
  std::string dir_;
  std::string bootstrap_;
};

/// A name no other test of this process uses: PREFIX-PID-N.
std::string unique_name(const std::string& prefix);

/// A record as a raw consumer read it.
struct RawRecord {
  std::int32_t partition = 0;
  std::int64_t offset = 0;
  std::optional<std::string> key;
  std::string value;
  std::map<std::string, std::string> headers;  ///< the first value of each name
};

/// Every record of the topic from `from` (per partition; default 0) up to its high watermark
/// now, in partition then offset order.
std::vector<RawRecord> read_topic(const std::string& bootstrap, const std::string& topic,
                                  const std::map<std::int32_t, std::int64_t>& from = {});

/// Committed offsets and what a group has not committed: testing/kafka_mock/raw_client.hpp.
using kafka_raw::committed_offsets;
using kafka_raw::uncommitted;

/// Runs `kcat -P -b BOOTSTRAP -t TOPIC [-k KEY] [-H NAME=VALUE]...` with `value` on stdin (one
/// record); throws unless it exits 0.
void kcat_produce(const std::string& bootstrap, const std::string& topic, const std::string& value,
                  const std::vector<std::pair<std::string, std::string>>& headers, const std::optional<std::string>& key = {});

}  // namespace idem::kafka_test
