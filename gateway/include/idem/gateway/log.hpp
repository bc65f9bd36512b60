#pragma once

#include <string>
#include <string_view>

#include "idem/gateway/config.hpp"

namespace idem::gateway::log {

/// Sets the most detailed level written (default info).
void set_level(LogLevel level);

/// Whether messages at `level` are written; test it before building an expensive message.
bool enabled(LogLevel level);

/// Writes one line "2024-05-01T12:00:00.123Z info message" to stderr. On a thread that called
/// buffer_this_thread(), info and debug lines are buffered (flushed at 16 KiB and by flush());
/// warnings and errors are written at once, after what was buffered.
void write(LogLevel level, std::string_view message);

/// Writes an info line whatever the level (start-up and shutdown milestones), unbuffered.
void notice(std::string_view message);

/// Makes this thread buffer its info/debug lines; it must call flush() periodically.
void buffer_this_thread();

/// Writes what this thread has buffered.
void flush();

/// Appends `s` to `out` as a double-quoted string, escaping '"', '\\' and non-printable bytes.
void append_quoted(std::string& out, std::string_view s);

}  // namespace idem::gateway::log
