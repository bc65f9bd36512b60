// idem-client-e2e-driver: many operations through idem::client from several threads, with a journal,
// for the client end-to-end test (test_e2e.py). Made to be killed (SIGKILL) and run again.
//
//   idem-client-e2e-driver --url URL --ops N --threads T --journal PATH --intents PATH --results PATH
//       [--resume] [--attempts N] [--base-delay-ms MS] [--max-delay-ms MS] [--attempt-timeout-ms MS]
//       [--deadline-ms MS] [--tag TEXT]
//
// Operation i is `POST URL` with the body {"op":i,"tag":TAG}. Its key (a fresh UUIDv4) is appended to
// the intents file ("i KEY") before the first attempt: the application's own record of the
// operation, which the docs recommend for operations with an identity. When it ends, one line goes to
// the results file ("i KEY STATUS ATTEMPTS REPLAYED EXECUTION_ID STOP PHASE"). Lines are appended
// with one write(2) each, so a SIGKILL leaves whole lines (the kernel keeps them).
//
// A run first (with --resume) calls Client::resume() for what the journal holds, then re-sends
// with their recorded keys the operations that have an intent but no result (killed after the
// journal forgot them and before their result was written), then sends the operations never
// started. Prints a JSON summary on stdout; exit 0 when every operation got a 2xx.
#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <stdexcept>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "idem/client/client.hpp"
#include "idem/client/key.hpp"

namespace {

using namespace idem;
using namespace idem::client;

struct Args {
  std::string url;
  int ops = 500;
  int threads = 5;
  std::string journal;
  std::string intents;
  std::string results;
  bool resume = false;
  int attempts = 12;
  long base_delay_ms = 5;
  long max_delay_ms = 50;
  long attempt_timeout_ms = 10'000;
  long deadline_ms = 60'000;
  std::string tag = "e2e";
};

/// An append-only file of whole lines.
class LineLog {
 public:
  explicit LineLog(const std::string& path) : fd_(::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644)) {
    if (fd_ < 0) throw std::runtime_error("cannot open " + path + ": " + std::strerror(errno));
  }
  ~LineLog() { ::close(fd_); }
  void append(std::string line) {
    line += '\n';
    std::lock_guard lock(mutex_);
    if (::write(fd_, line.data(), line.size()) != static_cast<ssize_t>(line.size())) {
      throw std::runtime_error(std::string("cannot append a line: ") + std::strerror(errno));
    }
  }

 private:
  int fd_;
  std::mutex mutex_;
};

/// The lines of a file split on spaces (none if the file does not exist).
std::vector<std::vector<std::string>> read_lines(const std::string& path) {
  std::vector<std::vector<std::string>> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::vector<std::string> row;
    for (std::string f; fields >> f;) row.push_back(f);
    if (!row.empty()) out.push_back(std::move(row));
  }
  return out;
}

/// The op number in a body {"op":N,...}; -1 if there is none.
int op_of(std::string_view body) {
  const auto at = body.find("\"op\":");
  if (at == std::string_view::npos) return -1;
  return std::atoi(std::string(body.substr(at + 5, 12)).c_str());
}

struct Summary {
  std::atomic<int> sent{0}, resumed{0}, resent_from_intents{0}, succeeded{0}, failed{0}, replayed{0};
  std::atomic<long> attempts{0};
};

std::string result_line(int op, const SendResult& r, std::string_view phase) {
  std::string exec = "-";
  if (r.response) {
    if (auto id = find_header(r.response->headers, "X-Execution-Id")) exec = std::string(*id);
  }
  return std::to_string(op) + " " + r.key + " " + (r.response ? std::to_string(r.response->status) : "-") + " " +
         std::to_string(r.attempts) + " " + (r.replayed ? "1" : "0") + " " + exec + " " +
         std::string(to_string(r.stop)) + " " + std::string(phase);
}

void record(LineLog& results, Summary& summary, int op, const SendResult& r, std::string_view phase) {
  summary.attempts += r.attempts;
  if (r.replayed) ++summary.replayed;
  if (r.ok()) {
    ++summary.succeeded;
  } else {
    ++summary.failed;
    std::cerr << "idem-client-e2e-driver: op " << op << " key " << r.key << " stopped: " << to_string(r.stop)
              << (r.error ? " (" + r.error->message + ")" : std::string()) << "\n";
  }
  results.append(result_line(op, r, phase));
}

int run(const Args& args) {
  auto journal = Journal::open(args.journal);
  if (!journal) throw std::runtime_error("journal: " + journal.error().message);
  ClientOptions options;
  options.retry.max_attempts = args.attempts;
  options.retry.base_delay = Millis{args.base_delay_ms};
  options.retry.max_delay = Millis{args.max_delay_ms};
  options.retry.attempt_timeout = Millis{args.attempt_timeout_ms};
  options.retry.deadline = Millis{args.deadline_ms};
  // A 30 % loss rate is an outage by the budget's measure (retries ~40 % of operations, the budget
  // allows ~10 %): it would rightly stop retrying. This test is about keys, not about load.
  options.budget.enabled = false;
  Client client(options, nullptr, std::shared_ptr<Journal>(std::move(*journal)));

  std::map<int, std::string> intents;  // op -> key
  for (const auto& row : read_lines(args.intents)) {
    if (row.size() >= 2) intents[std::stoi(row[0])] = row[1];
  }
  std::set<int> done;
  for (const auto& row : read_lines(args.results)) done.insert(std::stoi(row[0]));

  LineLog intent_log(args.intents);
  LineLog results(args.results);
  Summary summary;

  if (args.resume) {
    // Which op each pending operation is, from its journaled body.
    std::map<std::string, int> op_by_key;
    auto pending = client.pending();
    if (!pending) throw std::runtime_error("journal: " + pending.error().message);
    for (const Operation& op : *pending) op_by_key[op.key] = op_of(op.request.body);
    auto resumed = client.resume();
    if (!resumed) throw std::runtime_error("journal: " + resumed.error().message);
    for (const SendResult& r : *resumed) {
      const int op = op_by_key.count(r.key) ? op_by_key[r.key] : -1;
      ++summary.resumed;
      record(results, summary, op, r, "resume");
      done.insert(op);
    }
  }

  std::vector<int> todo;
  for (int i = 0; i < args.ops; ++i) {
    if (!done.count(i)) todo.push_back(i);
  }
  const auto send_one = [&](int op) {
    std::string key;
    std::string_view phase = "send";
    if (auto it = intents.find(op); it != intents.end()) {
      key = it->second;  // started before a crash, outcome unknown here: the same key again
      phase = "intent";
      ++summary.resent_from_intents;
    } else {
      auto fresh = new_key();
      if (!fresh) throw std::runtime_error(fresh.error());
      key = *fresh;
      intent_log.append(std::to_string(op) + " " + key);
    }
    HttpRequest request;
    request.url = args.url;
    request.headers = {{"Content-Type", "application/json"}};
    request.body = "{\"op\":" + std::to_string(op) + ",\"tag\":\"" + args.tag + "\"}";
    ++summary.sent;
    record(results, summary, op, client.send(std::move(request), key), phase);
  };

  std::atomic<std::size_t> next{0};
  std::mutex crash_mutex;
  std::string crash;  // the first exception of a worker, rethrown after the join
  std::vector<std::thread> workers;
  for (int t = 0; t < args.threads; ++t) {
    workers.emplace_back([&] {
      try {
        for (std::size_t at = next++; at < todo.size(); at = next++) send_one(todo[at]);
      } catch (const std::exception& e) {
        std::lock_guard lock(crash_mutex);
        if (crash.empty()) crash = e.what();
        next = todo.size();  // the others stop too
      }
    });
  }
  for (auto& w : workers) w.join();
  if (!crash.empty()) throw std::runtime_error(crash);

  auto letters = client.dead_letters();
  auto left = client.pending();
  std::cout << "{\"sent\":" << summary.sent << ",\"resumed\":" << summary.resumed
            << ",\"resent_from_intents\":" << summary.resent_from_intents << ",\"succeeded\":" << summary.succeeded
            << ",\"failed\":" << summary.failed << ",\"attempts\":" << summary.attempts
            << ",\"replayed\":" << summary.replayed << ",\"dead_letters\":" << (letters ? letters->size() : 999999)
            << ",\"pending\":" << (left ? left->size() : 999999) << "}" << std::endl;
  return summary.failed == 0 ? 0 : 1;
}

int usage(const std::string& why) {
  std::cerr << "idem-client-e2e-driver: " << why
            << "\nusage: idem-client-e2e-driver --url URL --journal PATH --intents PATH --results PATH [--ops N] "
               "[--threads T] [--resume] [--attempts N] [--base-delay-ms MS] [--max-delay-ms MS] "
               "[--attempt-timeout-ms MS] [--deadline-ms MS] [--tag TEXT]\n";
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  Args args;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    if (a == "--resume") {
      args.resume = true;
      continue;
    }
    if (i + 1 >= argc) return usage("missing value after " + std::string(a));
    const std::string v = argv[++i];
    if (a == "--url") args.url = v;
    else if (a == "--ops") args.ops = std::atoi(v.c_str());
    else if (a == "--threads") args.threads = std::atoi(v.c_str());
    else if (a == "--journal") args.journal = v;
    else if (a == "--intents") args.intents = v;
    else if (a == "--results") args.results = v;
    else if (a == "--attempts") args.attempts = std::atoi(v.c_str());
    else if (a == "--base-delay-ms") args.base_delay_ms = std::atol(v.c_str());
    else if (a == "--max-delay-ms") args.max_delay_ms = std::atol(v.c_str());
    else if (a == "--attempt-timeout-ms") args.attempt_timeout_ms = std::atol(v.c_str());
    else if (a == "--deadline-ms") args.deadline_ms = std::atol(v.c_str());
    else if (a == "--tag") args.tag = v;
    else return usage("unknown argument " + std::string(a));
  }
  if (args.url.empty() || args.journal.empty() || args.intents.empty() || args.results.empty()) {
    return usage("--url, --journal, --intents and --results are required");
  }
  if (args.ops < 0 || args.threads < 1) return usage("--ops >= 0 and --threads >= 1");
  try {
    return run(args);
  } catch (const std::exception& e) {
    std::cerr << "idem-client-e2e-driver: " << e.what() << "\n";
    return 1;
  }
}
