#include "idem/encrypted_store.hpp"

#include <utility>

namespace idem {
namespace {

StoreError no_admin() {
  return StoreError{StoreErrc::internal, "this store has no operator interface", false};
}

// Opens the response of `record` in place. False, with `error` set, when it cannot be opened.
bool open_record(const KeyRing& keys, Record& record, OpenError& error) {
  if (!record.response || !is_sealed(*record.response)) return true;
  auto opened = keys.open(RecordId{record.tenant, record.key}, std::move(*record.response));
  if (!opened) {
    error = std::move(opened.error());
    record.response.reset();
    return false;
  }
  record.response = std::move(*opened);
  return true;
}

}  // namespace

StoreError undecryptable_error(const OpenError& error) {
  return StoreError{StoreErrc::undecryptable, error.message, false};
}

EncryptedStore::EncryptedStore(std::unique_ptr<Store> inner, StoreAdmin* inner_admin,
                               std::shared_ptr<const KeyRing> keys)
    : inner_(std::move(inner)), inner_admin_(inner_admin), keys_(std::move(keys)) {}

void EncryptedStore::set_keys(std::shared_ptr<const KeyRing> keys) { keys_.store(std::move(keys)); }

std::shared_ptr<const KeyRing> EncryptedStore::keys() const { return keys_.load(); }

namespace {

// Opens the response a claim found.
StoreResult<ClaimResult> open_claim(const KeyRing& keys, StoreResult<ClaimResult> r) {
  if (!r) return r;
  OpenError error;
  if (!open_record(keys, r->record, error)) {
    // Only a replay needs the response. A mismatch is answered from the hash alone, so it
    // stays a mismatch (without the response): refusing it as unreadable would tell the
    // client less than the truth.
    if (r->status == ClaimStatus::completed) return std::unexpected(undecryptable_error(error));
  }
  return r;
}

}  // namespace

void EncryptedStore::claim(ClaimRequest request, Callback<ClaimResult> done) {
  inner_->claim(std::move(request), [keys = keys(), done = std::move(done)](StoreResult<ClaimResult> r) mutable {
    done(open_claim(*keys, std::move(r)));
  });
}

void EncryptedStore::complete(CompleteRequest request, Callback<FenceStatus> done) {
  auto sealed = keys()->seal(request.fence.id, request.response);
  if (!sealed) return done(std::unexpected(std::move(sealed.error())));
  request.response = std::move(*sealed);
  inner_->complete(std::move(request), std::move(done));
}

void EncryptedStore::fail(FailRequest request, Callback<FenceStatus> done) {
  inner_->fail(std::move(request), std::move(done));
}

void EncryptedStore::release(Fence fence, Callback<FenceStatus> done) { inner_->release(std::move(fence), std::move(done)); }
void EncryptedStore::abandon(AbandonRequest request, Callback<FenceStatus> done) {
  inner_->abandon(std::move(request), std::move(done));
}

void EncryptedStore::claim_many(std::vector<ClaimRequest> requests, BatchCallback<ClaimResult> done) {
  inner_->claim_many(std::move(requests), [keys = keys(), done = std::move(done)](BatchResults<ClaimResult> rs) mutable {
    for (auto& r : rs) r = open_claim(*keys, std::move(r));
    done(std::move(rs));
  });
}

void EncryptedStore::complete_many(std::vector<CompleteRequest> requests, BatchCallback<FenceStatus> done) {
  // The items that could be sealed go to the inner store; their answers are put back in place
  // among those that could not.
  const auto ring = keys();
  BatchResults<FenceStatus> results(requests.size());
  std::vector<std::size_t> sent_at;
  std::vector<CompleteRequest> sent;
  sent.reserve(requests.size());
  for (std::size_t i = 0; i < requests.size(); ++i) {
    auto sealed = ring->seal(requests[i].fence.id, requests[i].response);
    if (!sealed) {
      results[i] = std::unexpected(std::move(sealed.error()));
      continue;
    }
    requests[i].response = std::move(*sealed);
    sent.push_back(std::move(requests[i]));
    sent_at.push_back(i);
  }
  inner_->complete_many(std::move(sent), [results = std::move(results), sent_at = std::move(sent_at),
                                          done = std::move(done)](BatchResults<FenceStatus> answers) mutable {
    for (std::size_t j = 0; j < answers.size() && j < sent_at.size(); ++j) results[sent_at[j]] = std::move(answers[j]);
    done(std::move(results));
  });
}

void EncryptedStore::fail_many(std::vector<FailRequest> requests, BatchCallback<FenceStatus> done) {
  inner_->fail_many(std::move(requests), std::move(done));
}

void EncryptedStore::release_many(std::vector<Fence> fences, BatchCallback<FenceStatus> done) {
  inner_->release_many(std::move(fences), std::move(done));
}

void EncryptedStore::get(RecordId id, Callback<std::optional<Record>> done) {
  inner_->get(std::move(id), [keys = keys(), done = std::move(done)](StoreResult<std::optional<Record>> r) mutable {
    if (!r || !*r) return done(std::move(r));
    OpenError error;
    if (!open_record(*keys, **r, error)) return done(std::unexpected(undecryptable_error(error)));
    done(std::move(r));
  });
}

void EncryptedStore::purge_expired(TimePoint now, std::size_t limit, Callback<std::size_t> done) {
  inner_->purge_expired(now, limit, std::move(done));
}

void EncryptedStore::ping(Callback<Done> done) { inner_->ping(std::move(done)); }

bool EncryptedStore::expires_records_itself() const noexcept { return inner_->expires_records_itself(); }

void EncryptedStore::list(ListQuery query, Callback<std::vector<Record>> done) {
  if (inner_admin_ == nullptr) return done(std::unexpected(no_admin()));
  inner_admin_->list(std::move(query),
                     [keys = keys(), done = std::move(done)](StoreResult<std::vector<Record>> r) mutable {
                       if (!r) return done(std::move(r));
                       OpenError error;
                       for (Record& record : *r) {
                         if (!open_record(*keys, record, error)) {
                           return done(std::unexpected(undecryptable_error(error)));
                         }
                       }
                       done(std::move(r));
                     });
}

void EncryptedStore::mark_retryable(RecordId id, TimePoint now, Callback<AdminStatus> done) {
  if (inner_admin_ == nullptr) return done(std::unexpected(no_admin()));
  inner_admin_->mark_retryable(std::move(id), now, std::move(done));
}

void EncryptedStore::resolve(RecordId id, StoredResponse response, TimePoint now, TimePoint expires,
                             Callback<AdminStatus> done) {
  if (inner_admin_ == nullptr) return done(std::unexpected(no_admin()));
  auto sealed = keys()->seal(id, response);
  if (!sealed) return done(std::unexpected(std::move(sealed.error())));
  inner_admin_->resolve(std::move(id), std::move(*sealed), now, expires, std::move(done));
}

void EncryptedStore::count(TimePoint now, Callback<StateCounts> done) {
  if (inner_admin_ == nullptr) return done(std::unexpected(no_admin()));
  inner_admin_->count(now, std::move(done));
}

}  // namespace idem
