#include "idem/gateway/log.hpp"

#include "idem/gateway/access_log.hpp"

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <mutex>
#include <thread>
#include <utility>

namespace idem::gateway::log {
namespace {

using namespace std::chrono_literals;

std::atomic<int> g_level{static_cast<int>(LogLevel::info)};
std::atomic<int> g_format{static_cast<int>(LogFormat::text)};

bool json_format() { return g_format.load(std::memory_order_relaxed) == static_cast<int>(LogFormat::json); }

void append_timestamp(std::string& out);
void append_head(std::string& out, LogLevel level, std::string_view event);
void append_json_text(std::string& out, std::string_view s);

// Every line reaches stderr through one writer thread, so that a reader that stops reading
// (a stalled journald, a pipe into a stuck process) never blocks an event loop: the loops only
// append to a bounded queue. When the queue is full, lines are dropped and counted; the writer
// says how many once stderr takes lines again.
class Sink {
 public:
  static Sink& instance() {
    // Never destroyed: the writer may be blocked in write() at exit, and the process ends
    // without waiting for it.
    static Sink* sink = new Sink;
    return *sink;
  }

  // Queues `text` (whole lines); returns the sequence number that wait_written() takes.
  std::uint64_t submit(std::string& text) {
    std::uint64_t seq;
    {
      std::lock_guard lock(mutex_);
      if (pending_.size() + text.size() > kMaxPending) {
        std::uint64_t lines = 0;
        for (const char c : text) lines += c == '\n';
        dropped_ += lines;
        dropped_total_.fetch_add(lines, std::memory_order_relaxed);
      } else {
        pending_ += text;
      }
      seq = ++submitted_;
    }
    text.clear();
    wake_.notify_one();
    return seq;
  }

  // Waits until what submit() numbered `seq` has been written (or dropped), at most `timeout`.
  void wait_written(std::uint64_t seq, std::chrono::milliseconds timeout) {
    std::unique_lock lock(mutex_);
    written_cv_.wait_for(lock, timeout, [&] { return written_ >= seq; });
  }

  std::uint64_t last_submitted() {
    std::lock_guard lock(mutex_);
    return submitted_;
  }

  std::uint64_t dropped_total() const { return dropped_total_.load(std::memory_order_relaxed); }

 private:
  // Lines waiting for stderr; beyond this, new lines are dropped.
  static constexpr std::size_t kMaxPending = 4 * 1024 * 1024;

  Sink() { std::thread([this] { run(); }).detach(); }

  void run() {
    std::string batch;
    for (;;) {
      std::uint64_t upto, dropped;
      {
        std::unique_lock lock(mutex_);
        wake_.wait(lock, [&] { return !pending_.empty() || dropped_ > 0; });
        batch.swap(pending_);
        upto = submitted_;
        dropped = std::exchange(dropped_, 0);
      }
      if (dropped > 0) {
        std::string note;
        const std::string text = std::to_string(dropped) +
                                 " lines dropped: stderr was not being read (see idem_log_lines_dropped_total)";
        append_head(note, LogLevel::warn, "log");
        if (json_format()) {
          append_json_text(note, text);
          note += "}\n";
        } else {
          note += "log: " + text + "\n";
        }
        write_all(note);
      }
      write_all(batch);
      batch.clear();
      {
        std::lock_guard lock(mutex_);
        written_ = upto;
      }
      written_cv_.notify_all();
    }
  }

  static void write_all(const std::string& data) {
    std::size_t off = 0;
    while (off < data.size()) {
      const ssize_t n = ::write(STDERR_FILENO, data.data() + off, data.size() - off);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;  // stderr is gone; nothing better to do with a log line
      off += static_cast<std::size_t>(n);
    }
  }

  std::mutex mutex_;
  std::condition_variable wake_, written_cv_;
  std::string pending_;          // guarded by mutex_
  std::uint64_t submitted_ = 0;  // guarded by mutex_: submit() calls so far
  std::uint64_t written_ = 0;    // guarded by mutex_: submit() calls written (or dropped)
  std::uint64_t dropped_ = 0;    // guarded by mutex_: lines dropped since the last note
  std::atomic<std::uint64_t> dropped_total_{0};
};

// How long a warning, an error or a notice from a thread that serves no requests (start-up,
// shutdown, the store's threads) waits for its line to reach stderr, so that it is written before
// what it announces happens. Event loops never wait: the queue already keeps every line in order.
constexpr std::chrono::milliseconds kWaitForUrgentLines = 100ms;

struct ThreadBuffer {
  bool buffered = false;
  std::string data;
  ~ThreadBuffer() { flush(); }
  std::uint64_t flush() { return data.empty() ? 0 : Sink::instance().submit(data); }
};

thread_local ThreadBuffer t_buffer;


// "2024-05-01T12:00:00.123Z" (UTC, milliseconds), what idemctl prints too.
void append_time(std::string& out) {
  const auto now = std::chrono::system_clock::now();
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count();
  const std::time_t secs = static_cast<std::time_t>(ms / 1000);
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char buf[40];
  const int n = std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900, tm.tm_mon + 1,
                              tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, static_cast<int>(ms % 1000));
  out.append(buf, static_cast<std::size_t>(n));
}

void append_timestamp(std::string& out) {
  append_time(out);
  out += ' ';
}

// What every line starts with: `TIME LEVEL ` as text, or `{"time":...,"level":...,"event":...,`
// as JSON, whose members the caller appends before closing the object.
void append_head(std::string& out, LogLevel level, std::string_view event) {
  if (!json_format()) {
    append_timestamp(out);
    out += level_name(level);
    out += ' ';
    return;
  }
  out += "{\"time\":\"";
  append_time(out);
  out += "\",\"level\":\"";
  out += level_name(level);
  out += "\",\"event\":";
  append_log_json_string(out, event);
  out += ',';
}

// A free-form line's text as the JSON member "message":"...".
void append_json_text(std::string& out, std::string_view s) {
  out += "\"message\":";
  append_log_json_string(out, s);
}

// `payload`: the message (text), or the object's members after the head (JSON, `members`).
void emit(LogLevel level, std::string_view event, std::string_view payload, bool members, bool now) {
  ThreadBuffer& b = t_buffer;
  append_head(b.data, level, event);
  if (!json_format()) {
    b.data += payload;
  } else if (members) {
    b.data += payload;
    b.data += '}';
  } else {
    append_json_text(b.data, payload);
    b.data += '}';
  }
  b.data += '\n';
  if (now || level <= LogLevel::warn) {
    const auto seq = b.flush();
    if (!b.buffered) Sink::instance().wait_written(seq, kWaitForUrgentLines);
  } else if (!b.buffered || b.data.size() >= 16 * 1024) {
    b.flush();
  }
}

}  // namespace

void set_level(LogLevel level) { g_level.store(static_cast<int>(level), std::memory_order_relaxed); }

bool enabled(LogLevel level) { return static_cast<int>(level) <= g_level.load(std::memory_order_relaxed); }

void set_format(LogFormat format) { g_format.store(static_cast<int>(format), std::memory_order_relaxed); }

LogFormat format() { return static_cast<LogFormat>(g_format.load(std::memory_order_relaxed)); }

void write(LogLevel level, std::string_view message) {
  if (enabled(level)) emit(level, "log", message, false, false);
}

void event(LogLevel level, std::string_view name, std::string_view payload) {
  if (enabled(level)) emit(level, name, payload, json_format(), false);
}

void notice(std::string_view message) { emit(LogLevel::info, "notice", message, false, true); }

void buffer_this_thread() { t_buffer.buffered = true; }

void flush() { t_buffer.flush(); }

void drain(std::chrono::milliseconds timeout) {
  t_buffer.flush();
  Sink::instance().wait_written(Sink::instance().last_submitted(), timeout);
}

std::uint64_t dropped_lines() { return Sink::instance().dropped_total(); }

std::string_view level_name(LogLevel level) {
  switch (level) {
    case LogLevel::error: return "error";
    case LogLevel::warn: return "warn";
    case LogLevel::info: return "info";
    case LogLevel::debug: return "debug";
  }
  return "?";
}

void append_quoted(std::string& out, std::string_view s) {
  out += '"';
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += ch;
    } else if (c < 0x20 || c >= 0x7f) {
      char esc[8];
      std::snprintf(esc, sizeof esc, "\\x%02x", c);
      out += esc;
    } else {
      out += ch;
    }
  }
  out += '"';
}

}  // namespace idem::gateway::log
