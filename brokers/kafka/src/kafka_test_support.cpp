#include "kafka_test_support.hpp"

#include "raw_client.hpp"

#include <fcntl.h>
#include <librdkafka/rdkafka.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <stdexcept>
#include <thread>

namespace idem::kafka_test {
namespace {

using namespace std::chrono_literals;
using Steady = std::chrono::steady_clock;

std::string mock_path() {
  if (const char* env = std::getenv("IDEM_KAFKA_MOCK"); env != nullptr && *env != '\0') return env;
  return IDEM_KAFKA_MOCK_PATH;  // set by CMake: the idem-kafka-mock built with this test
}

using kafka_raw::PartitionList;

std::atomic<int> names{0};

}  // namespace

std::string unique_name(const std::string& prefix) {
  return prefix + "-" + std::to_string(::getpid()) + "-" + std::to_string(++names);
}

MockCluster::MockCluster(int brokers) {
  std::string pattern = (std::filesystem::temp_directory_path() / "idem-kafka-mock.XXXXXX").string();
  if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error(std::string("mkdtemp: ") + std::strerror(errno));
  dir_ = pattern;
  const std::string port_file = dir_ + "/bootstrap";
  const std::string path = mock_path();

  int in[2], out[2];
  if (::pipe2(in, O_CLOEXEC) != 0 || ::pipe2(out, O_CLOEXEC) != 0) throw std::runtime_error("pipe failed");
  const std::string brokers_arg = std::to_string(brokers);
  pid_ = ::fork();
  if (pid_ < 0) throw std::runtime_error("fork failed");
  if (pid_ == 0) {
    // The child: the mock ends with this test process, however that ends.
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    ::dup2(in[0], STDIN_FILENO);
    ::dup2(out[1], STDOUT_FILENO);
    // IDEM_TEST_KAFKA_BOOTSTRAP: a real cluster instead of a mock one (testing/kafka_mock).
    const char* real = std::getenv("IDEM_TEST_KAFKA_BOOTSTRAP");
    const bool use_real = real != nullptr && *real != '\0';
    const char* argv[] = {path.c_str(), use_real ? "--connect" : "--brokers", use_real ? real : brokers_arg.c_str(),
                          "--port-file", port_file.c_str(), nullptr};
    ::execv(path.c_str(), const_cast<char* const*>(argv));
    std::fprintf(stderr, "cannot run %s: %s\n", path.c_str(), std::strerror(errno));
    ::_exit(127);
  }
  ::close(in[0]);
  ::close(out[1]);
  to_child_ = in[1];
  from_child_ = ::fdopen(out[0], "r");

  // A mock that does not come up is stopped before the error is thrown (no destructor runs).
  const auto give_up = [&](const std::string& why) {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    ::close(to_child_);
    std::fclose(from_child_);
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
    throw std::runtime_error(why);
  };
  const auto deadline = Steady::now() + 10s;
  while (Steady::now() < deadline) {
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      give_up("idem-kafka-mock (" + path + ") exited at start (status " + std::to_string(status) + ")");
    }
    std::ifstream f(port_file);
    if (std::getline(f, bootstrap_) && !bootstrap_.empty()) return;
    std::this_thread::sleep_for(20ms);
  }
  give_up("idem-kafka-mock (" + path + ") wrote no " + port_file + " within 10 s");
}

MockCluster::~MockCluster() {
  if (pid_ > 0) {
    ::kill(pid_, SIGTERM);
    const auto deadline = Steady::now() + 5s;
    int status = 0;
    while (::waitpid(pid_, &status, WNOHANG) == 0) {
      if (Steady::now() > deadline) {
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, &status, 0);
        break;
      }
      std::this_thread::sleep_for(20ms);
    }
  }
  if (to_child_ >= 0) ::close(to_child_);
  if (from_child_ != nullptr) std::fclose(from_child_);
  std::error_code ignored;
  if (!dir_.empty()) std::filesystem::remove_all(dir_, ignored);
}

std::string MockCluster::command(const std::string& line) {
  const std::string text = line + "\n";
  if (::write(to_child_, text.data(), text.size()) != static_cast<ssize_t>(text.size())) {
    throw std::runtime_error("writing to idem-kafka-mock failed");
  }
  std::array<char, 1024> buf{};
  if (std::fgets(buf.data(), buf.size(), from_child_) == nullptr) throw std::runtime_error("idem-kafka-mock did not answer " + line);
  std::string answer = buf.data();
  while (!answer.empty() && (answer.back() == '\n' || answer.back() == '\r')) answer.pop_back();
  return answer;
}

void MockCluster::create_topic(const std::string& name, int partitions) {
  const std::string answer = command("topic " + name + " " + std::to_string(partitions));
  if (answer != "ok") throw std::runtime_error("creating topic " + name + ": " + answer);
}

MockCluster& MockCluster::shared() {
  static MockCluster cluster(3);
  return cluster;
}

std::vector<RawRecord> read_topic(const std::string& bootstrap, const std::string& topic,
                                  const std::map<std::int32_t, std::int64_t>& from) {
  auto rk = kafka_raw::consumer(bootstrap, unique_name("reader"));
  const auto high = kafka_raw::watermarks(rk.get(), topic);
  PartitionList assignment(rd_kafka_topic_partition_list_new(static_cast<int>(high.size())));
  std::map<std::int32_t, std::int64_t> left;  // partition -> the offset it must reach
  for (const auto& [p, h] : high) {
    const auto it = from.find(p);
    const std::int64_t start = it == from.end() ? 0 : it->second;
    rd_kafka_topic_partition_list_add(assignment.get(), topic.c_str(), p)->offset = start;
    if (h > start) left[p] = h;
  }
  if (rd_kafka_assign(rk.get(), assignment.get()) != RD_KAFKA_RESP_ERR_NO_ERROR) throw std::runtime_error("assign failed");
  std::vector<RawRecord> out;
  const auto deadline = Steady::now() + 15s;
  while (!left.empty()) {
    if (Steady::now() > deadline) throw std::runtime_error("reading " + topic + " took longer than 15 s");
    rd_kafka_message_t* m = rd_kafka_consumer_poll(rk.get(), 100);
    if (m == nullptr) continue;
    if (m->err == RD_KAFKA_RESP_ERR_NO_ERROR) {
      RawRecord r;
      r.partition = m->partition;
      r.offset = m->offset;
      if (m->key != nullptr) r.key = std::string(static_cast<const char*>(m->key), m->key_len);
      if (m->payload != nullptr) r.value = std::string(static_cast<const char*>(m->payload), m->len);
      rd_kafka_headers_t* headers = nullptr;
      if (rd_kafka_message_headers(m, &headers) == RD_KAFKA_RESP_ERR_NO_ERROR) {
        const char* name = nullptr;
        const void* value = nullptr;
        std::size_t size = 0;
        for (std::size_t i = 0; rd_kafka_header_get_all(headers, i, &name, &value, &size) == RD_KAFKA_RESP_ERR_NO_ERROR; ++i) {
          r.headers.emplace(name, value == nullptr ? std::string() : std::string(static_cast<const char*>(value), size));
        }
      }
      if (auto it = left.find(r.partition); it != left.end() && r.offset + 1 >= it->second) left.erase(it);
      out.push_back(std::move(r));
    }
    rd_kafka_message_destroy(m);
  }
  std::sort(out.begin(), out.end(), [](const RawRecord& a, const RawRecord& b) {
    return a.partition != b.partition ? a.partition < b.partition : a.offset < b.offset;
  });
  return out;
}

void kcat_produce(const std::string& bootstrap, const std::string& topic, const std::string& value,
                  const std::vector<std::pair<std::string, std::string>>& headers, const std::optional<std::string>& key) {
  std::vector<std::string> args = {"kcat", "-P", "-b", bootstrap, "-t", topic};
  if (key) {
    args.push_back("-k");
    args.push_back(*key);
  }
  for (const auto& [name, v] : headers) {
    args.push_back("-H");
    args.push_back(name + "=" + v);
  }
  int in[2];
  if (::pipe2(in, O_CLOEXEC) != 0) throw std::runtime_error("pipe failed");
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) {
    ::dup2(in[0], STDIN_FILENO);
    ::execvp("kcat", argv.data());
    std::fprintf(stderr, "cannot run kcat: %s\n", std::strerror(errno));
    ::_exit(127);
  }
  ::close(in[0]);
  const std::string line = value + "\n";
  const bool written = ::write(in[1], line.data(), line.size()) == static_cast<ssize_t>(line.size());
  ::close(in[1]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (!written || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    throw std::runtime_error("kcat -P failed (status " + std::to_string(status) + ")");
  }
}

}  // namespace idem::kafka_test
