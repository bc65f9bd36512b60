#include "idem/gateway/log.hpp"

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <ctime>

namespace idem::gateway::log {
namespace {

std::atomic<int> g_level{static_cast<int>(LogLevel::info)};

struct ThreadBuffer {
  bool buffered = false;
  std::string data;
  ~ThreadBuffer() { flush(); }
  void flush() {
    std::size_t off = 0;
    while (off < data.size()) {
      const ssize_t n = ::write(STDERR_FILENO, data.data() + off, data.size() - off);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;  // stderr is gone; nothing better to do with a log line
      off += static_cast<std::size_t>(n);
    }
    data.clear();
  }
};

thread_local ThreadBuffer t_buffer;

std::string_view level_name(LogLevel level) {
  switch (level) {
    case LogLevel::error: return "error";
    case LogLevel::warn: return "warn";
    case LogLevel::info: return "info";
    case LogLevel::debug: return "debug";
  }
  return "?";
}

void append_timestamp(std::string& out) {
  const auto now = std::chrono::system_clock::now();
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count();
  const std::time_t secs = static_cast<std::time_t>(ms / 1000);
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char buf[40];
  const int n = std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ ", tm.tm_year + 1900, tm.tm_mon + 1,
                              tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, static_cast<int>(ms % 1000));
  out.append(buf, static_cast<std::size_t>(n));
}

void emit(LogLevel level, std::string_view message, bool now) {
  ThreadBuffer& b = t_buffer;
  append_timestamp(b.data);
  b.data += level_name(level);
  b.data += ' ';
  b.data += message;
  b.data += '\n';
  if (now || !b.buffered || level <= LogLevel::warn || b.data.size() >= 16 * 1024) b.flush();
}

}  // namespace

void set_level(LogLevel level) { g_level.store(static_cast<int>(level), std::memory_order_relaxed); }

bool enabled(LogLevel level) { return static_cast<int>(level) <= g_level.load(std::memory_order_relaxed); }

void write(LogLevel level, std::string_view message) {
  if (enabled(level)) emit(level, message, false);
}

void notice(std::string_view message) { emit(LogLevel::info, message, true); }

void buffer_this_thread() { t_buffer.buffered = true; }

void flush() { t_buffer.flush(); }

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
