#include "sqs_test_support.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <thread>

extern char** environ;

namespace idem::sqs_test {
namespace {

using namespace std::chrono_literals;
using sqs_detail::ClientConfig;
using sqs_detail::Reply;
using Steady = std::chrono::steady_clock;

std::atomic<int> names{0};

std::string node_path() {
  if (const char* env = std::getenv("IDEM_NODE"); env != nullptr && *env != '\0') return env;
  return IDEM_NODE_PATH;  // set by CMake: find_program(NODE node)
}

std::string emulator_dir() { return IDEM_SQS_EMULATOR_DIR; }

// Fails the test (never skips it) with what to do when the emulator cannot run here.
void check_installed() {
  const std::string node = node_path();
  if (node.empty() || node.ends_with("NOTFOUND") || ::access(node.c_str(), X_OK) != 0) {
    throw std::runtime_error("node (Node.js 20+) was not found when CMake configured this test (\"" + node +
                             "\"): install nodejs (scripts/deps does) and configure again, or set IDEM_NODE");
  }
  if (!std::filesystem::exists(emulator_dir() + "/node_modules/fauxqs/package.json") ||
      !std::filesystem::exists(emulator_dir() + "/node_modules/@aws-sdk/client-sqs/package.json")) {
    throw std::runtime_error(emulator_dir() + "/node_modules is missing or incomplete: run `npm ci` in " + emulator_dir() +
                             " (scripts/deps does)");
  }
}

ClientConfig config_for(int port) {
  ClientConfig c;
  c.endpoint = "http://127.0.0.1:" + std::to_string(port) + "/";
  c.region = kRegion;
  c.access_key_id = kKeyId;
  c.secret_access_key = kSecret;
  c.connect_timeout = 2s;
  return c;
}

}  // namespace

std::string unique_name(const std::string& prefix) {
  return prefix + "-" + std::to_string(::getpid()) + "-" + std::to_string(++names);
}

// ---- Emulator -----------------------------------------------------------------------------

Emulator::Emulator() {
  check_installed();
  std::string pattern = (std::filesystem::temp_directory_path() / "idem-sqs-emulator.XXXXXX").string();
  if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error(std::string("mkdtemp: ") + std::strerror(errno));
  dir_ = pattern;
  try {
    start(0);
  } catch (...) {
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
    throw;
  }
}

Emulator::~Emulator() {
  if (pid_ > 0) {
    ::kill(pid_, SIGTERM);
    wait_until_stopped();
  }
  std::error_code ignored;
  if (!dir_.empty()) std::filesystem::remove_all(dir_, ignored);
}

std::string Emulator::endpoint() const { return "http://127.0.0.1:" + std::to_string(port_) + "/"; }

Emulator& Emulator::shared() {
  static Emulator emulator;
  return emulator;
}

void Emulator::kill() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGKILL);
  wait_until_stopped();
}

void Emulator::start_again() {
  if (pid_ > 0) throw std::runtime_error("the emulator is still running");
  start(port_);
}

void Emulator::wait_until_stopped() {
  const auto deadline = Steady::now() + 5s;
  int status = 0;
  while (::waitpid(pid_, &status, WNOHANG) == 0) {
    if (Steady::now() > deadline) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, &status, 0);
      break;
    }
    std::this_thread::sleep_for(10ms);
  }
  pid_ = -1;
}

void Emulator::start(int port) {
  const std::string port_file = dir_ + "/port";
  std::filesystem::remove(port_file);
  const std::string node = node_path();
  const std::string script = emulator_dir() + "/serve.mjs";
  const std::string port_arg = std::to_string(port);
  pid_ = ::fork();
  if (pid_ < 0) throw std::runtime_error("fork failed");
  if (pid_ == 0) {
    // The child: the emulator ends with this test process, however that ends.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    const char* argv[] = {node.c_str(), "--no-warnings", script.c_str(), "--port-file", port_file.c_str(),
                          "--port",     port_arg.c_str(), nullptr};
    ::execv(node.c_str(), const_cast<char* const*>(argv));
    std::fprintf(stderr, "cannot run %s: %s\n", node.c_str(), std::strerror(errno));
    ::_exit(127);
  }
  const auto deadline = Steady::now() + 20s;
  while (Steady::now() < deadline) {
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      throw std::runtime_error("the SQS emulator (" + node + " " + script + ") exited at start (status " + std::to_string(status) +
                               ")");
    }
    std::ifstream f(port_file);
    std::string line;
    if (std::getline(f, line) && !line.empty()) {
      port_ = std::stoi(line);
      return;
    }
    std::this_thread::sleep_for(20ms);
  }
  ::kill(pid_, SIGKILL);
  ::waitpid(pid_, nullptr, 0);
  pid_ = -1;
  throw std::runtime_error("the SQS emulator (" + script + ") wrote no port file within 20 s");
}

// ---- Api ----------------------------------------------------------------------------------

Api::Api(const Emulator& emulator) : port_(emulator.port()), client_(config_for(emulator.port())) {}

std::string Api::queue_url(const std::string& name) const {
  return "http://127.0.0.1:" + std::to_string(port_) + "/" + kAccount + "/" + name;
}

std::string Api::url(const std::string& name, const std::string& parameters) const {
  return std::string("sqs+http://") + kKeyId + ":" + kSecret + "@127.0.0.1:" + std::to_string(port_) + "/" + kAccount + "/" + name +
         "?region=" + kRegion + parameters;
}

Reply Api::call(const std::string& action, const std::string& body) {
  Reply r = client_.call({action, body, std::chrono::seconds(10)});
  if (!r.ok()) {
    throw std::runtime_error(action + " failed: curl " + std::to_string(r.curl_code) + " " + r.curl_detail + ", HTTP " +
                             std::to_string(r.status) + ": " + r.body);
  }
  return r;
}

void Api::create_queue(const std::string& name, const std::map<std::string, std::string>& attributes) {
  nlohmann::json body = {{"QueueName", name}};
  if (!attributes.empty()) body["Attributes"] = attributes;
  if (name.ends_with(".fifo")) body["Attributes"]["FifoQueue"] = "true";
  call("CreateQueue", body.dump());
}

std::map<std::string, std::string> Api::attributes(const std::string& name) {
  auto parsed = sqs_detail::parse_attributes(call("GetQueueAttributes", sqs_detail::get_attributes_request(queue_url(name), {"All"})).body);
  if (!parsed) throw std::runtime_error(parsed.error());
  return *parsed;
}

std::size_t Api::outstanding(const std::string& name) {
  const auto a = attributes(name);
  std::size_t n = 0;
  for (const char* key : {"ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible", "ApproximateNumberOfMessagesDelayed"}) {
    if (auto it = a.find(key); it != a.end()) n += std::stoul(it->second);
  }
  return n;
}

std::vector<sqs_detail::ReceivedMessage> Api::peek(const std::string& name, int visibility) {
  auto parsed = sqs_detail::parse_receive(
      call("ReceiveMessage", sqs_detail::receive_request(queue_url(name), sqs_detail::kMaxBatchEntries, 0, visibility)).body);
  if (!parsed) throw std::runtime_error(parsed.error());
  return std::move(*parsed);
}

std::vector<sqs_detail::ReceivedMessage> Api::take_all(const std::string& name) {
  std::vector<sqs_detail::ReceivedMessage> out;
  while (true) {
    auto batch = peek(name, 30);
    if (batch.empty()) return out;
    std::vector<std::pair<std::string, std::string>> receipts;
    for (std::size_t i = 0; i < batch.size(); ++i) receipts.emplace_back(std::to_string(i), batch[i].receipt_handle);
    call("DeleteMessageBatch", sqs_detail::delete_batch_request(queue_url(name), receipts));
    for (auto& m : batch) out.push_back(std::move(m));
  }
}

// ---- the SDK producer ---------------------------------------------------------------------

void sdk_produce(const std::string& queue_url, const std::vector<SdkMessage>& messages) {
  check_installed();
  std::string input;
  for (const SdkMessage& m : messages) {
    nlohmann::json line = {{"body", m.body}};
    if (!m.id.empty()) line["id"] = m.id;
    if (!m.content_type.empty()) line["content_type"] = m.content_type;
    if (!m.group.empty()) line["group"] = m.group;
    if (!m.dedup.empty()) line["dedup"] = m.dedup;
    if (!m.attributes.empty()) line["attributes"] = m.attributes;
    input += line.dump() + "\n";
  }
  // The child's environment: this one's, with the test's credentials and region (execve: no
  // setenv between fork and exec in a threaded process).
  std::vector<std::string> env_strings = {std::string("AWS_ACCESS_KEY_ID=") + kKeyId, std::string("AWS_SECRET_ACCESS_KEY=") + kSecret,
                                          std::string("AWS_REGION=") + kRegion};
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string_view v(*e);
    if (v.starts_with("AWS_")) continue;
    env_strings.emplace_back(v);
  }
  std::vector<char*> envp;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);

  const std::string node = node_path();
  const std::string script = emulator_dir() + "/produce.mjs";
  int in[2], out[2];
  if (::pipe2(in, O_CLOEXEC) != 0 || ::pipe2(out, O_CLOEXEC) != 0) throw std::runtime_error("pipe failed");
  const pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    ::dup2(in[0], STDIN_FILENO);
    ::dup2(out[1], STDOUT_FILENO);
    const char* argv[] = {node.c_str(), "--no-warnings", script.c_str(), queue_url.c_str(), nullptr};
    ::execve(node.c_str(), const_cast<char* const*>(argv), envp.data());
    std::fprintf(stderr, "cannot run %s: %s\n", node.c_str(), std::strerror(errno));
    ::_exit(127);
  }
  ::close(in[0]);
  ::close(out[1]);
  std::size_t written = 0;
  while (written < input.size()) {
    const ssize_t n = ::write(in[1], input.data() + written, input.size() - written);
    if (n <= 0) break;
    written += static_cast<std::size_t>(n);
  }
  ::close(in[1]);
  std::string said;
  char buffer[256];
  ssize_t n = 0;
  while ((n = ::read(out[0], buffer, sizeof buffer)) > 0) said.append(buffer, static_cast<std::size_t>(n));
  ::close(out[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    throw std::runtime_error("produce.mjs failed (status " + std::to_string(status) + "): " + said);
  }
  if (said != "sent " + std::to_string(messages.size()) + "\n") throw std::runtime_error("produce.mjs said: " + said);
}

}  // namespace idem::sqs_test
