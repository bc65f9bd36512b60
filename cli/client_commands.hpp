#pragma once

// The client's commands as functions over an idem::client::Client and its Journal: `idemctl send`,
// `pending`, `dead-letters` and `resume` parse their arguments, build a Client (libcurl, the
// journal file) and call these. Each returns the process's exit status and writes only to `o`.

#include <optional>
#include <string>

#include "common.hpp"
#include "idem/client/client.hpp"

namespace idem::cli {

/// The exit status for a send's result: 0 for a 2xx, 2 when the request was refused before sending
/// (bad key), 1 for anything else (a non-2xx final answer, retries exhausted, transport failure).
int send_exit_code(const client::SendResult& result);

/// The one line that tells a shell user what happened, without the "idemctl: " prefix:
/// `key=K attempts=2 replayed=true status=201 stop=success` (+ ` error="..."` when the last
/// attempt got no answer, ` detail="..."` when refused).
std::string summary_line(const client::SendResult& result);

/// A result as JSON: key, attempts, replayed, stop, status, headers, body_size, body_base64, error.
nlohmann::json result_json(const client::SendResult& result);

/// Reports a result: the last answer's body (raw) or, with `o.json`, a JSON summary on `o.out`;
/// the summary line on `o.err`, and a hint when the operation was kept for later. `journal_path`
/// is empty without a journal. Returns send_exit_code(result).
int report_send(const client::SendResult& result, const std::string& journal_path, const Output& o);

/// `send`: sends `request` (with `key`, else a new UUIDv4) and reports it.
int run_send(client::Client& client, client::HttpRequest request, std::optional<std::string> key,
             const std::string& journal_path, const Output& o);

/// `pending`: the journal's pending operations (sent, no final answer yet).
int run_pending(client::Journal& journal, const Output& o);

/// `pending drop KEY`: forgets a pending operation without sending it. Exit 1 if there is none.
int run_drop_pending(client::Journal& journal, const std::string& key, const Output& o);

/// `dead-letters` (`list`): operations the client gave up on, with their last answer.
int run_dead_letters(client::Journal& journal, const Output& o);

/// `dead-letters retry KEY`: back to pending, sent again with its original key; reported as send.
int run_retry_dead_letter(client::Client& client, const std::string& key, const std::string& journal_path,
                          const Output& o);

/// `dead-letters drop KEY`: deletes a dead letter. Exit 1 if there is none.
int run_drop_dead_letter(client::Journal& journal, const std::string& key, const Output& o);

/// `resume`: sends every pending operation again with its original key (after a crash). Exit 0
/// when all of them (or none) got a 2xx.
int run_resume(client::Client& client, const std::string& journal_path, const Output& o);

}  // namespace idem::cli
