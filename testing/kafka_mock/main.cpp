// idem-kafka-mock: librdkafka's mock Kafka cluster (rdkafka_mock.h) as a process, for the Kafka
// module's tests and for trying idem against "a Kafka" without a JVM.
//
//   idem-kafka-mock [--brokers N] [--topic NAME:PARTITIONS]... --port-file PATH
//   idem-kafka-mock --connect HOST:PORT[,HOST:PORT...] [--topic ...] --port-file PATH
//
// The brokers listen on 127.0.0.1, on ports the system picks; once they do, the bootstrap
// servers ("127.0.0.1:P1,127.0.0.1:P2,...") are written to PATH (atomically: a reader never
// sees half of it). Then commands are read from stdin, one per line, each answered on stdout
// with "ok" or "error: WHY":
//   topic NAME PARTITIONS            create a topic (the mock has no CreateTopics)
//   broker-down ID | broker-up ID    stop / restart a broker's listener (its partitions keep
//                                    their leader: the mock does not fail them over)
//   leader TOPIC PARTITION BROKER    move a partition's leader
//   coordinator group GROUP BROKER   move a consumer group's coordinator
//   topic-error TOPIC CODE           answer metadata requests for the topic with Kafka error
//                                    CODE (3: unknown topic, 29: not authorized; 0: none)
//   lag TOPIC GROUP                  "ok N": the records of TOPIC that GROUP has not committed
//   quit                             exit
// With --connect it hosts no cluster: it writes the given bootstrap servers to PATH and answers
// `topic` (the admin API's CreateTopics) and `lag` against that real cluster, and refuses the
// fault commands, so that the tests that need no faults run unchanged against a real Kafka.
// It runs until `quit` or SIGTERM/SIGINT; the end of stdin only stops the reading.
//
// What the mock lacks (librdkafka 2.0.2): transactions, CreateTopics, leader failover, more
// than ~5 MiB kept per partition (older records are dropped), and its group rebalances wait
// for session.timeout.ms - 1 s before they complete. It also creates (with 4 partitions) any
// topic a metadata request names, so "no such topic" is played with topic-error.

#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>
#include <poll.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "raw_client.hpp"

namespace {

volatile std::sig_atomic_t g_stop = 0;

void on_signal(int) { g_stop = 1; }

void usage(const char* argv0) {
  std::fprintf(stderr,
               "usage: %s [--brokers N | --connect BOOTSTRAP] [--topic NAME:PARTITIONS]... --port-file PATH\n"
               "  then stdin commands: topic NAME PARTITIONS | broker-down ID | broker-up ID |\n"
               "  leader TOPIC PARTITION BROKER | coordinator group GROUP BROKER |\n"
               "  topic-error TOPIC CODE | lag TOPIC GROUP | quit\n",
               argv0);
}

bool parse_int(const std::string& text, int min, int max, int& out) {
  char* end = nullptr;
  errno = 0;
  const long v = std::strtol(text.c_str(), &end, 10);
  if (text.empty() || errno != 0 || end == nullptr || *end != '\0' || v < min || v > max) return false;
  out = static_cast<int>(v);
  return true;
}

struct Topic {
  std::string name;
  int partitions = 1;
};

class Mock {
 public:
  // `connect`: a real cluster's bootstrap servers, to use instead of hosting a mock one.
  Mock(int brokers, std::string connect) : brokers_(brokers), connect_(std::move(connect)) {}
  ~Mock() {
    if (cluster_ != nullptr) rd_kafka_mock_cluster_destroy(cluster_);
    if (rk_ != nullptr) rd_kafka_destroy(rk_);
  }

  bool start(std::string& error) {
    if (!connect_.empty()) return true;
    std::array<char, 512> errstr{};
    rd_kafka_conf_t* conf = rd_kafka_conf_new();
    // The handle only hosts the cluster's thread; it never connects anywhere.
    if (rd_kafka_conf_set(conf, "log_level", "3", errstr.data(), errstr.size()) != RD_KAFKA_CONF_OK) {
      rd_kafka_conf_destroy(conf);
      error = errstr.data();
      return false;
    }
    rk_ = rd_kafka_new(RD_KAFKA_PRODUCER, conf, errstr.data(), errstr.size());
    if (rk_ == nullptr) {
      rd_kafka_conf_destroy(conf);
      error = errstr.data();
      return false;
    }
    cluster_ = rd_kafka_mock_cluster_new(rk_, brokers_);
    if (cluster_ == nullptr) {
      error = "rd_kafka_mock_cluster_new failed";
      return false;
    }
    return true;
  }

  std::string bootstraps() const { return connect_.empty() ? rd_kafka_mock_cluster_bootstraps(cluster_) : connect_; }

  std::string create_topic(const std::string& name, int partitions) {
    if (!connect_.empty()) {
      try {
        idem::kafka_raw::create_topic(connect_, name, partitions);
        return "ok";
      } catch (const std::exception& e) {
        return std::string("error: ") + e.what();
      }
    }
    const int replication = brokers_ < 3 ? brokers_ : 3;
    return answer(rd_kafka_mock_topic_create(cluster_, name.c_str(), partitions, replication));
  }

  // One stdin command; the answer line.
  std::string run(const std::string& line, bool& quit) {
    std::istringstream in(line);
    std::string verb;
    in >> verb;
    std::vector<std::string> args;
    for (std::string a; in >> a;) args.push_back(a);
    int a = 0, b = 0;
    if (verb.empty()) return "error: empty command";
    if (verb == "quit") {
      quit = true;
      return "ok";
    }
    if (verb == "topic" && args.size() == 2 && parse_int(args[1], 1, 10000, a)) return create_topic(args[0], a);
    if (verb == "lag" && args.size() == 2) return lag(args[0], args[1]);
    if (!connect_.empty()) return "error: " + verb + " needs the mock cluster (--connect points at a real one)";
    if ((verb == "broker-down" || verb == "broker-up") && args.size() == 1 && parse_int(args[0], 1, brokers_, a)) {
      return answer(verb == "broker-down" ? rd_kafka_mock_broker_set_down(cluster_, a) : rd_kafka_mock_broker_set_up(cluster_, a));
    }
    if (verb == "leader" && args.size() == 3 && parse_int(args[1], 0, 100000, a) && parse_int(args[2], -1, brokers_, b)) {
      return answer(rd_kafka_mock_partition_set_leader(cluster_, args[0].c_str(), a, b));
    }
    if (verb == "coordinator" && args.size() == 3 && args[0] == "group" && parse_int(args[2], 1, brokers_, a)) {
      return answer(rd_kafka_mock_coordinator_set(cluster_, "group", args[1].c_str(), a));
    }
    if (verb == "topic-error" && args.size() == 2 && parse_int(args[1], 0, 1000, a)) {
      rd_kafka_mock_topic_set_error(cluster_, args[0].c_str(), static_cast<rd_kafka_resp_err_t>(a));
      return "ok";
    }
    return "error: unknown or malformed command (topic NAME PARTITIONS | broker-down ID | broker-up ID | "
           "leader TOPIC PARTITION BROKER | coordinator group GROUP BROKER | topic-error TOPIC CODE | lag TOPIC GROUP | quit; brokers are 1-" +
           std::to_string(brokers_) + ")";
  }

 private:
  // Read by a client of the cluster, as any consumer would see it.
  std::string lag(const std::string& topic, const std::string& group) const {
    try {
      return "ok " + std::to_string(idem::kafka_raw::uncommitted(bootstraps(), topic, group));
    } catch (const std::exception& e) {
      return std::string("error: ") + e.what();
    }
  }

  static std::string answer(rd_kafka_resp_err_t err) {
    return err == RD_KAFKA_RESP_ERR_NO_ERROR ? "ok" : std::string("error: ") + rd_kafka_err2str(err);
  }

  int brokers_;
  std::string connect_;
  rd_kafka_t* rk_ = nullptr;
  rd_kafka_mock_cluster_t* cluster_ = nullptr;
};

bool write_atomically(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << text << '\n';
    if (!out.flush()) return false;
  }
  return std::rename(tmp.c_str(), path.c_str()) == 0;
}

}  // namespace

int main(int argc, char** argv) {
  int brokers = 1;
  std::string connect;
  std::string port_file;
  std::vector<Topic> topics;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const bool has_value = i + 1 < argc;
    if (arg == "--help" || arg == "-h") {
      usage(argv[0]);
      return 0;
    }
    if (arg == "--brokers" && has_value) {
      if (!parse_int(argv[++i], 1, 16, brokers)) {
        std::fprintf(stderr, "idem-kafka-mock: --brokers takes 1-16\n");
        return 2;
      }
    } else if (arg == "--topic" && has_value) {
      const std::string spec = argv[++i];
      const auto colon = spec.rfind(':');
      Topic t;
      t.name = spec.substr(0, colon);
      if (colon == std::string::npos || t.name.empty() || !parse_int(spec.substr(colon + 1), 1, 10000, t.partitions)) {
        std::fprintf(stderr, "idem-kafka-mock: --topic takes NAME:PARTITIONS (1-10000), not %s\n", spec.c_str());
        return 2;
      }
      topics.push_back(t);
    } else if (arg == "--connect" && has_value) {
      connect = argv[++i];
    } else if (arg == "--port-file" && has_value) {
      port_file = argv[++i];
    } else {
      std::fprintf(stderr, "idem-kafka-mock: unknown or incomplete argument %s\n", arg.c_str());
      usage(argv[0]);
      return 2;
    }
  }
  if (port_file.empty()) {
    std::fprintf(stderr, "idem-kafka-mock: --port-file PATH is required\n");
    usage(argv[0]);
    return 2;
  }

  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  std::signal(SIGPIPE, SIG_IGN);  // a reader of stdout that went away ends nothing

  Mock mock(brokers, connect);
  std::string error;
  if (!mock.start(error)) {
    std::fprintf(stderr, "idem-kafka-mock: %s\n", error.c_str());
    return 1;
  }
  for (const Topic& t : topics) {
    if (const std::string r = mock.create_topic(t.name, t.partitions); r != "ok") {
      std::fprintf(stderr, "idem-kafka-mock: topic %s: %s\n", t.name.c_str(), r.c_str());
      return 1;
    }
  }
  if (!write_atomically(port_file, mock.bootstraps())) {
    std::fprintf(stderr, "idem-kafka-mock: cannot write %s: %s\n", port_file.c_str(), std::strerror(errno));
    return 1;
  }

  // Commands from stdin; poll() so that a signal is seen within a tenth of a second.
  std::string pending;
  bool reading = true;
  bool quit = false;
  while (!g_stop && !quit) {
    pollfd p{STDIN_FILENO, POLLIN, 0};
    if (!reading) {
      ::usleep(100'000);
      continue;
    }
    if (::poll(&p, 1, 100) <= 0) continue;
    std::array<char, 4096> buf{};
    const ssize_t n = ::read(STDIN_FILENO, buf.data(), buf.size());
    if (n <= 0) {
      if (n < 0 && errno == EINTR) continue;
      reading = false;  // end of stdin: keep serving until a signal
      continue;
    }
    pending.append(buf.data(), static_cast<std::size_t>(n));
    for (auto nl = pending.find('\n'); nl != std::string::npos && !quit; nl = pending.find('\n')) {
      std::string line = pending.substr(0, nl);
      pending.erase(0, nl + 1);
      if (!line.empty() && line.back() == '\r') line.pop_back();
      std::cout << mock.run(line, quit) << std::endl;
    }
  }
  return 0;
}
