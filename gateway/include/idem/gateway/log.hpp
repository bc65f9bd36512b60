#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

#include "idem/gateway/config.hpp"

namespace idem::gateway::log {

/// Sets the most detailed level written (default info).
void set_level(LogLevel level);

/// "error", "warn", "info" or "debug": the level as the configuration and the log lines name it.
std::string_view level_name(LogLevel level);

/// Sets how lines are written (default text): `TIME LEVEL message`, or one JSON object per line,
/// `{"time":"2024-05-01T12:00:00.123Z","level":"info","event":"log","message":"..."}`.
void set_format(LogFormat format);

/// The format lines are written in.
LogFormat format();

/// Whether messages at `level` are written; test it before building an expensive message.
bool enabled(LogLevel level);

/// Writes one line "2024-05-01T12:00:00.123Z info message" to stderr. On a thread that called
/// buffer_this_thread(), info and debug lines are buffered (flushed at 16 KiB and by flush());
/// warnings and errors are passed on at once, after what was buffered.
///
/// Lines reach stderr, in order, through a writer thread of their own: no caller ever blocks on
/// a reader that stopped reading. On a thread that does not buffer (not an event loop), a warning
/// or an error waits up to 100 ms for its line to be written, so that it comes out before what it
/// announces. While stderr takes nothing, up to 4 MiB of lines wait; beyond that, lines are
/// dropped and counted (dropped_lines()).
void write(LogLevel level, std::string_view message);

/// Writes a line about `name` (e.g. "key", "reload"), buffered like write(): `payload` is the
/// message in the text format, and the JSON object's members after "event" in the JSON format
/// (`"tenant":"acme","status":201`): the caller builds the one format() asks for.
void event(LogLevel level, std::string_view name, std::string_view payload);

/// Writes an info line whatever the level (start-up and shutdown milestones), like a warning.
void notice(std::string_view message);

/// Makes this thread buffer its info/debug lines; it must call flush() periodically.
void buffer_this_thread();

/// Passes on what this thread has buffered (without waiting for it to be written).
void flush();

/// Passes on what this thread has buffered, then waits until every line passed on so far has been
/// written, at most `timeout` (before the process exits).
void drain(std::chrono::milliseconds timeout);

/// Lines dropped so far because stderr was not being read (idem_log_lines_dropped_total).
std::uint64_t dropped_lines();

/// Appends `s` to `out` as a double-quoted string, escaping '"', '\\' and non-printable bytes.
void append_quoted(std::string& out, std::string_view s);

}  // namespace idem::gateway::log
