#pragma once

#include <atomic>
#include <memory>

#include "idem/encryption.hpp"
#include "idem/store.hpp"
#include "idem/store_admin.hpp"

namespace idem {

/// A Store (and its StoreAdmin) that keeps every stored response encrypted at rest (SPEC §12).
///
/// It wraps any backend, so memory, SQLite, PostgreSQL and Redis share one implementation and
/// whatever goes through the Store interface is covered: the gateway's records, idemctl resolve,
/// and Consumer::process_once's results. Responses are sealed on the way in (complete, resolve)
/// with the ring's sealing key, and opened on the way out (claim, get, list). Records stored in
/// plaintext before encryption was turned on still replay. Request hashes, tokens and times stay
/// in the clear: the claim decides on them inside the store.
///
/// A response that cannot be opened (its key is not in the ring, its bytes were altered, it was
/// copied from another record) is StoreErrc::undecryptable: never replayed, and never mistaken
/// for an absent record that would execute again.
///   claim   completed -> undecryptable (nothing was changed: the claim only looked).
///           mismatch  -> mismatch, without the response it could not open.
///   get     -> undecryptable.   list -> undecryptable (naming the first such record).
class EncryptedStore final : public Store, public StoreAdmin {
 public:
  /// Wraps `inner`, whose operator interface is `inner_admin` (may be null: the admin calls then
  /// fail with StoreErrc::internal). `keys` must not be null.
  EncryptedStore(std::unique_ptr<Store> inner, StoreAdmin* inner_admin, std::shared_ptr<const KeyRing> keys);

  /// Swaps the key ring (a reload): calls that start afterwards use the new one; calls in flight
  /// finish with the ring they started with. `keys` must not be null.
  void set_keys(std::shared_ptr<const KeyRing> keys);
  /// The ring calls use now.
  std::shared_ptr<const KeyRing> keys() const;

  /// The wrapped store, which sees sealed responses (for tools that show them as stored).
  Store& inner() { return *inner_; }
  /// The wrapped store's operator interface; may be null.
  StoreAdmin* inner_admin() { return inner_admin_; }

  void claim(ClaimRequest request, Callback<ClaimResult> done) override;
  void complete(CompleteRequest request, Callback<FenceStatus> done) override;
  void fail(FailRequest request, Callback<FenceStatus> done) override;
  void release(Fence fence, Callback<FenceStatus> done) override;
  void abandon(AbandonRequest request, Callback<FenceStatus> done) override;
  /// The batch calls go to the wrapped store's batch calls, sealing and opening each item as
  /// the single calls do; an item that cannot be sealed fails alone and is not sent.
  void claim_many(std::vector<ClaimRequest> requests, BatchCallback<ClaimResult> done) override;
  void complete_many(std::vector<CompleteRequest> requests, BatchCallback<FenceStatus> done) override;
  void fail_many(std::vector<FailRequest> requests, BatchCallback<FenceStatus> done) override;
  void release_many(std::vector<Fence> fences, BatchCallback<FenceStatus> done) override;
  void get(RecordId id, Callback<std::optional<Record>> done) override;
  void purge_expired(TimePoint now, std::size_t limit, Callback<std::size_t> done) override;
  void ping(Callback<Done> done) override;
  bool expires_records_itself() const noexcept override;

  void list(ListQuery query, Callback<std::vector<Record>> done) override;
  void mark_retryable(RecordId id, TimePoint now, Callback<AdminStatus> done) override;
  void resolve(RecordId id, StoredResponse response, TimePoint now, TimePoint expires,
               Callback<AdminStatus> done) override;
  void count(TimePoint now, Callback<StateCounts> done) override;

 private:
  std::unique_ptr<Store> inner_;
  StoreAdmin* inner_admin_;
  std::atomic<std::shared_ptr<const KeyRing>> keys_;
};

/// The StoreError for a response that cannot be opened (StoreErrc::undecryptable).
StoreError undecryptable_error(const OpenError& error);

}  // namespace idem
