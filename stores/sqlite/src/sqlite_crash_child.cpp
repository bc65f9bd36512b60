// The victim of sqlite_crash_test: writes one byte to stdout once its store is open, then
// completes keys one after another, each together with one
// business row, until it is SIGKILLed. A key it finds held by a killed predecessor is taken over
// once that holder's (short) lease has run out.
//
//   idem_sqlite_crash_child <db> <first key index> <lease ms>
//
// The database must already hold `CREATE TABLE business (key TEXT NOT NULL, token INTEGER NOT
// NULL)`, deliberately without a unique constraint so that a duplicate would be visible.
#include <sqlite3.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <thread>

#include "idem/sqlite_store.hpp"

namespace {

using namespace std::chrono_literals;

idem::TimePoint now() { return std::chrono::time_point_cast<idem::Millis>(std::chrono::system_clock::now()); }

std::string key_name(int index) {
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "crash-key-%06d", index);
  return buffer;
}

// Inserts the business row of `key`, written by the holder of `token`.
idem::SqliteWork insert_business_row(std::string key, std::uint64_t token) {
  return [key = std::move(key), token](sqlite3* db, std::string& error) {
    sqlite3_stmt* stmt = nullptr;
    if (sqlite3_prepare_v2(db, "INSERT INTO business (key, token) VALUES (?1, ?2)", -1, &stmt, nullptr) != SQLITE_OK) {
      error = sqlite3_errmsg(db);
      return false;
    }
    sqlite3_bind_text(stmt, 1, key.c_str(), -1, SQLITE_STATIC);
    sqlite3_bind_int64(stmt, 2, static_cast<sqlite3_int64>(token));
    const bool ok = sqlite3_step(stmt) == SQLITE_DONE;
    if (!ok) error = sqlite3_errmsg(db);
    sqlite3_finalize(stmt);
    return ok;
  };
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s <db> <first key index> <lease ms>\n", argv[0]);
    return 2;
  }
  idem::SqliteOptions options;
  options.path = argv[1];
  const int first = std::atoi(argv[2]);
  const idem::Millis lease{std::atoi(argv[3])};
  auto opened = idem::SqliteStore::open(options);
  if (!opened) {
    std::fprintf(stderr, "open: %s\n", opened.error().message.c_str());
    return 1;
  }
  idem::SqliteStore& store = **opened;
  // Tells the parent the store is open: its kill timer starts now.
  if (write(STDOUT_FILENO, "r", 1) != 1) return 4;
  idem::BlockingStore blocking(store);
  std::mt19937_64 random(std::random_device{}());

  for (int index = first; index < first + 100'000;) {
    const std::string key = key_name(index);
    idem::ClaimRequest request;
    request.id = idem::RecordId{"crash-tenant", key};
    request.request_hash = "same-request";
    request.token = random() | 1;  // nonzero
    request.now = now();
    request.lease_expires = request.now + lease;
    request.expires = request.now + 1h;
    auto claim = blocking.claim(request);
    if (!claim) {
      std::this_thread::sleep_for(1ms);
      continue;
    }
    switch (claim->status) {
      case idem::ClaimStatus::claimed: {
        const idem::Fence fence{request.id, request.token};
        const idem::TimePoint done_at = now();
        auto completed = store.complete_in_transaction(
            idem::CompleteRequest{fence, idem::StoredResponse{201, {{"Content-Type", "text/plain"}}, key}, done_at,
                                  done_at + 1h},
            insert_business_row(key, request.token));
        if (completed && *completed == idem::FenceStatus::ok) ++index;
        break;  // lost or failed: claim again
      }
      case idem::ClaimStatus::completed:
        ++index;
        break;
      case idem::ClaimStatus::in_progress:
        // A killed predecessor's record: wait out its lease, then take it over.
        std::this_thread::sleep_until(std::chrono::system_clock::now() + (claim->record.lease_expires - now()) + 1ms);
        break;
      case idem::ClaimStatus::mismatch:
      case idem::ClaimStatus::outcome_unknown:
        std::fprintf(stderr, "unexpected claim status for %s\n", key.c_str());
        return 3;
    }
  }
  return 0;
}
