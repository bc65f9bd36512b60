#include "idem/engine.hpp"

#include <algorithm>
#include <array>
#include <future>
#include <span>
#include <vector>

namespace idem {

std::string_view to_string(Verdict verdict) {
  switch (verdict) {
    case Verdict::pass_through: return "pass_through";
    case Verdict::execute: return "execute";
    case Verdict::replay: return "replay";
    case Verdict::in_use: return "in_use";
    case Verdict::mismatch: return "mismatch";
    case Verdict::outcome_unknown: return "outcome_unknown";
    case Verdict::key_missing: return "key_missing";
    case Verdict::key_invalid: return "key_invalid";
    case Verdict::store_unavailable: return "store_unavailable";
    case Verdict::record_unreadable: return "record_unreadable";
    case Verdict::ask: return "ask";
  }
  return "unknown";
}

std::string_view to_string(FinishStatus status) {
  switch (status) {
    case FinishStatus::stored: return "stored";
    case FinishStatus::released: return "released";
    case FinishStatus::failed_retryable: return "failed_retryable";
    case FinishStatus::fenced_out: return "fenced_out";
    case FinishStatus::abandoned: return "abandoned";
  }
  return "unknown";
}

Disposition classify_status(int status, bool store_server_errors) {
  // These say "not processed, try again": storing them would make the retry replay a refusal.
  if (status == 408 || status == 409 || status == 425 || status == 429) return Disposition::release;
  if (status >= 500) return store_server_errors ? Disposition::store : Disposition::fail;
  return Disposition::store;
}

bool is_safe_method(std::string_view method) {
  return method == "GET" || method == "HEAD" || method == "OPTIONS" || method == "TRACE";
}

Engine::Engine(Store& store, const Clock& clock) : store_(store), clock_(clock) {}

namespace {

// The FinishStatus of a fenced write: `success` when it applied.
Callback<FenceStatus> on_fence(FinishStatus success, Callback<FinishStatus> done) {
  return [success, done = std::move(done)](StoreResult<FenceStatus> r) mutable {
    if (!r) return done(std::unexpected(std::move(r.error())));
    done(*r == FenceStatus::ok ? success : FinishStatus::fenced_out);
  };
}

Decision refuse(Verdict verdict, std::string detail, std::chrono::seconds retry_after = {}) {
  Decision d;
  d.verdict = verdict;
  d.detail = std::move(detail);
  d.retry_after = retry_after;
  return d;
}

// The parts of a Policy a decision needs once the store has answered; copied into the callback
// so the caller's Policy need not outlive begin().
struct Terms {
  std::chrono::seconds retry_after;
  Millis retention;
  bool store_server_errors;
  bool ask;  // on_lease_expiry = ask
};

// Consumes `request`: the ticket takes its id and fingerprint.
Decision decision_from_claim(const Terms& policy, ClaimRequest&& request, ClaimResult claim) {
  switch (claim.status) {
    case ClaimStatus::claimed: {
      Decision d;
      // A holder vanished with the outcome unknown: under "ask" nothing runs before the upstream
      // says whether it happened. The takeover already fenced that holder out, in the store (the
      // token) and for the upstream (the attempt number the lookup carries).
      const bool ask = policy.ask && claim.kind == ClaimKind::after_lease_expiry;
      d.verdict = ask ? Verdict::ask : Verdict::execute;
      d.retry_after = policy.retry_after;
      d.ticket = Ticket{Fence{std::move(request.id), request.token},
                        std::move(request.request_hash),
                        claim.kind,
                        claim.record.attempt,
                        request.lease_expires,
                        policy.retention,
                        policy.store_server_errors};
      return d;
    }
    case ClaimStatus::completed: {
      Decision d;
      d.verdict = Verdict::replay;
      d.replay = std::move(claim.record.response);
      d.replay_expires = claim.record.expires;
      if (!d.replay) {
        // A completed record without a response can only come from a damaged store.
        return refuse(Verdict::store_unavailable, "the stored response for this key is unreadable",
                      policy.retry_after);
      }
      return d;
    }
    case ClaimStatus::mismatch:
      return refuse(Verdict::mismatch,
                    "this key was already used with a different request; use a new key for a new "
                    "request");
    case ClaimStatus::in_progress:
      return refuse(Verdict::in_use, "a request with this key is being processed; retry later",
                    policy.retry_after);
    case ClaimStatus::outcome_unknown:
      return refuse(Verdict::outcome_unknown,
                    "a request with this key started but its outcome is unknown; an operator must "
                    "resolve the key");
  }
  return refuse(Verdict::store_unavailable, "unexpected claim status", policy.retry_after);
}

}  // namespace

void Engine::begin(const Policy& policy, const RequestView& request, std::string tenant,
                   std::move_only_function<void(Decision)> done) {
  if (is_safe_method(request.method)) return done(Decision{});

  // Two values are enough to refuse a repeated key header: no allocation for the usual one.
  std::array<std::string_view, 2> key_values;
  std::size_t key_count = 0;
  for (const auto& h : request.headers) {
    if (key_count < key_values.size() && iequals(h.name, policy.key_header)) key_values[key_count++] = h.value;
  }
  if (key_count == 0 && !policy.key_required) return done(Decision{});

  auto key = parse_key(std::span<const std::string_view>(key_values.data(), key_count), policy.key);
  if (!key) {
    const auto verdict = key.error().code == KeyErrc::missing ? Verdict::key_missing : Verdict::key_invalid;
    return done(refuse(verdict, std::move(key.error().detail)));
  }

  const TimePoint now = clock_.now();
  ClaimRequest claim;
  claim.id = RecordId{std::move(tenant), std::move(*key)};
  claim.request_hash = fingerprint(request, policy.fingerprint);
  claim.token = new_fencing_token();
  claim.now = now;
  claim.lease_expires = now + policy.lease;
  claim.expires = now + std::max(policy.retention, policy.lease);
  // "ask" takes over too: the lookup runs as the key's new holder.
  claim.take_over_expired_lease = policy.on_lease_expiry != LeaseExpiry::unknown;
  if (policy.on_lease_expiry == LeaseExpiry::ask) claim.lookup = policy.lookup;

  const Terms terms{policy.retry_after, policy.retention, policy.store_server_errors,
                    policy.on_lease_expiry == LeaseExpiry::ask};
  ClaimRequest copy = claim;  // the store consumes its request; the decision needs its fields
  store_.claim(std::move(claim), [terms, copy = std::move(copy),
                                  done = std::move(done)](StoreResult<ClaimResult> result) mutable {
    if (!result && result.error().code == StoreErrc::undecryptable) {
      // Not a store outage: retrying later cannot help until an operator restores the key, and
      // executing would run the operation a second time.
      Decision d = refuse(Verdict::record_unreadable,
                          "a request with this key was executed, but its stored response cannot be read "
                          "(it is encrypted with a key this server does not have, or was altered); it was not "
                          "executed again");
      d.store_error = std::move(result.error());
      return done(std::move(d));
    }
    if (!result) {
      Decision d = refuse(Verdict::store_unavailable,
                          "the idempotency store is unavailable; nothing was executed, retry later",
                          terms.retry_after);
      d.store_error = std::move(result.error());
      return done(std::move(d));
    }
    done(decision_from_claim(terms, std::move(copy), std::move(*result)));
  });
}

void Engine::finish(const Ticket& ticket, StoredResponse response, Callback<FinishStatus> done) {
  const TimePoint now = clock_.now();
  switch (classify_status(response.status, ticket.store_server_errors)) {
    case Disposition::store:
      store_.complete(CompleteRequest{ticket.fence, std::move(response), now, now + ticket.retention},
                      on_fence(FinishStatus::stored, std::move(done)));
      return;
    case Disposition::fail:
      store_.fail(FailRequest{ticket.fence, now, now + ticket.retention},
                  on_fence(FinishStatus::failed_retryable, std::move(done)));
      return;
    case Disposition::release:
      release(ticket, std::move(done));
      return;
  }
}

void Engine::release(const Ticket& ticket, Callback<FinishStatus> done) {
  if (ticket.kind != ClaimKind::fresh) {
    // Deleting a taken-over key would start it over at attempt 1, below numbers the upstream has
    // already seen for it; failed_retryable lets the next retry execute all the same, as the
    // attempt after this one.
    const TimePoint now = clock_.now();
    store_.fail(FailRequest{ticket.fence, now, now + ticket.retention},
                on_fence(FinishStatus::failed_retryable, std::move(done)));
    return;
  }
  store_.release(ticket.fence, on_fence(FinishStatus::released, std::move(done)));
}

void Engine::resolve(const Ticket& ticket, StoredResponse response, Callback<FinishStatus> done) {
  const TimePoint now = clock_.now();
  store_.complete(CompleteRequest{ticket.fence, std::move(response), now, now + ticket.retention},
                  on_fence(FinishStatus::stored, std::move(done)));
}

void Engine::unclaim(const Ticket& ticket, Callback<FinishStatus> done) {
  switch (ticket.kind) {
    case ClaimKind::fresh:
      store_.release(ticket.fence, on_fence(FinishStatus::released, std::move(done)));
      return;
    case ClaimKind::after_failure: {
      const TimePoint now = clock_.now();
      store_.fail(FailRequest{ticket.fence, now, now + ticket.retention},
                  on_fence(FinishStatus::failed_retryable, std::move(done)));
      return;
    }
    case ClaimKind::after_lease_expiry:
      // The vanished holder's outcome is as unknown as before: leave it for the next claim.
      store_.abandon(AbandonRequest{ticket.fence, clock_.now()}, on_fence(FinishStatus::abandoned, std::move(done)));
      return;
  }
}

Decision Engine::begin_and_wait(const Policy& policy, const RequestView& request, std::string tenant) {
  std::promise<Decision> promise;
  auto future = promise.get_future();
  begin(policy, request, std::move(tenant), [&promise](Decision d) { promise.set_value(std::move(d)); });
  return future.get();
}

StoreResult<FinishStatus> Engine::finish_and_wait(const Ticket& ticket, StoredResponse response) {
  return wait_for<FinishStatus>([&](auto done) { finish(ticket, std::move(response), std::move(done)); });
}

StoreResult<FinishStatus> Engine::release_and_wait(const Ticket& ticket) {
  return wait_for<FinishStatus>([&](auto done) { release(ticket, std::move(done)); });
}

StoreResult<FinishStatus> Engine::resolve_and_wait(const Ticket& ticket, StoredResponse response) {
  return wait_for<FinishStatus>([&](auto done) { resolve(ticket, std::move(response), std::move(done)); });
}

StoreResult<FinishStatus> Engine::unclaim_and_wait(const Ticket& ticket) {
  return wait_for<FinishStatus>([&](auto done) { unclaim(ticket, std::move(done)); });
}

}  // namespace idem
