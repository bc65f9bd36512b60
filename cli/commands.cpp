// What every idemctl command uses to talk to the shell: stdin, stdout, and ending with a status.

#include "commands.hpp"

#include <CLI/CLI.hpp>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>

#include "idem/redact.hpp"

namespace idem::cli {

std::string read_stdin() {
  std::string error_message;
  auto data = read_data_argument("@-", error_message);
  if (!data) fail(kExitFailure, error_message);
  return std::move(*data);
}

void write_stdout(std::string_view text) {
  if (std::fwrite(text.data(), 1, text.size(), stdout) != text.size() || std::fflush(stdout) != 0) {
    fail(kExitFailure, std::string("cannot write stdout: ") + std::strerror(errno));
  }
}

void fail(int exit_code, std::string_view message) {
  const std::string shown = redact_text(message);  // every URL in it, whoever built the message
  std::fprintf(stderr, "idemctl: %s\n", shown.c_str());
  throw CLI::RuntimeError(exit_code);
}

void finish(int exit_code) {
  std::cout.flush();
  if (!std::cout || std::fflush(stdout) != 0) {
    fail(kExitFailure, std::string("cannot write stdout: ") + std::strerror(errno));
  }
  if (exit_code != kExitOk) throw CLI::RuntimeError(exit_code);
}

}  // namespace idem::cli
