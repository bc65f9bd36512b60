#include "idem/consumer.hpp"

#include <utility>

#include "idem/fingerprint.hpp"
#include "idem/key.hpp"

namespace idem {
namespace {

constexpr std::size_t kMaxName = 128;
constexpr std::size_t kMaxMessageId = 256;

// The payload's hash, framed so it can never equal an HTTP request's fingerprint; hashed in
// place, without copying a large payload.
std::string payload_hash(std::string_view payload) {
  Sha256 hash;
  hash.update("idem message\n");
  hash.update(payload);
  return hash.hex_digest();
}

MessageOutcome invalid_id(std::string_view id) {
  std::string why = id.empty() ? "is empty"
                    : id.size() > kMaxMessageId
                        ? "is longer than " + std::to_string(kMaxMessageId) + " characters"
                        : "has a character that is not visible ASCII (encode such ids, e.g. in hex)";
  return MessageOutcome{MessageStatus::invalid_id, std::string(), "the message id " + why + "; nothing was run"};
}

// Why a held message was lost: its handler's effect happened outside the store (process_once),
// or was rolled back with the completion (the transactional forms).
constexpr std::string_view kLostAfterEffect =
    "the handler ran, but its lease ran out and another delivery took the message over before it was recorded "
    "(make the consumer's lease longer than its handler's worst case)";
constexpr std::string_view kLostRolledBack =
    "the lease ran out and another delivery took the message over before this one committed; nothing of this "
    "delivery was kept (make the consumer's lease longer than its handler's worst case)";

// The outcome for a held message after its completion was attempted: processed, lost (the
// fence failed; `lost_detail` says what became of the effect), or the store's error.
StoreResult<MessageOutcome> completion_outcome(const StoreResult<FenceStatus>& completed, std::string result,
                                               std::string_view lost_detail) {
  if (!completed) return std::unexpected(completed.error());
  MessageOutcome outcome;
  if (*completed == FenceStatus::ok) {
    outcome.status = MessageStatus::processed;
    outcome.result = std::move(result);
  } else {
    outcome.status = MessageStatus::lost;
    outcome.detail = lost_detail;
  }
  return outcome;
}

// Notes on a handler_failed outcome that its claim could not be forgotten.
void note_release_failure(MessageOutcome& outcome, const StoreError& error) {
  outcome.detail += " (forgetting the claim failed: " + error.message +
                    "; the message stays in progress until its lease runs out)";
}

// The outcome of one held message of a transactional batch, from its item's answer.
StoreResult<MessageOutcome> work_outcome(StoreResult<WorkResult> answer) {
  if (!answer) return std::unexpected(std::move(answer.error()));
  switch (answer->status) {
    case WorkStatus::committed:
      return MessageOutcome{MessageStatus::processed, std::string(), std::string()};
    case WorkStatus::declined:
      return MessageOutcome{MessageStatus::handler_failed, std::string(), std::move(answer->error)};
    case WorkStatus::lost:
      break;
  }
  return MessageOutcome{MessageStatus::lost, std::string(), std::string(kLostRolledBack)};
}

}  // namespace

std::string_view to_string(MessageStatus status) {
  switch (status) {
    case MessageStatus::processed: return "processed";
    case MessageStatus::duplicate: return "duplicate";
    case MessageStatus::in_progress: return "in_progress";
    case MessageStatus::outcome_unknown: return "outcome_unknown";
    case MessageStatus::conflict: return "conflict";
    case MessageStatus::handler_failed: return "handler_failed";
    case MessageStatus::lost: return "lost";
    case MessageStatus::invalid_id: return "invalid_id";
  }
  return "unknown";
}

std::expected<Consumer, std::string> Consumer::create(Store& store, ConsumerOptions options) {
  if (options.name.empty() || options.name.size() > kMaxName || !all_visible_ascii(options.name)) {
    return std::unexpected("consumer name \"" + options.name + "\": expected 1-" + std::to_string(kMaxName) +
                           " visible ASCII characters (no spaces)");
  }
  if (options.lease <= Millis::zero()) return std::unexpected(std::string("consumer lease: must be positive"));
  if (options.on_lease_expiry == LeaseExpiry::ask) {
    // "ask" resolves an outcome through an upstream's HTTP lookup, which a queue does not have.
    return std::unexpected(std::string("consumer on_lease_expiry: \"ask\" is for gateway routes; use "
                                       "\"reexecute\" or \"unknown\""));
  }
  if (options.retention <= Millis::zero()) return std::unexpected(std::string("consumer retention: must be positive"));
  return Consumer(store, std::move(options));
}

Consumer::Consumer(Store& store, ConsumerOptions options)
    : store_(&store), options_(std::move(options)), tenant_("consumer " + options_.name) {}

TimePoint Consumer::now() const {
  return options_.clock ? options_.clock->now() : SystemClock::instance().now();
}

ClaimRequest Consumer::claim_request(std::string_view message_id, std::string_view payload) const {
  ClaimRequest request;
  request.id = RecordId{tenant_, std::string(message_id)};
  request.request_hash = payload_hash(payload);
  request.token = new_fencing_token();
  request.now = now();
  request.lease_expires = request.now + options_.lease;
  request.expires = request.now + options_.retention;
  request.take_over_expired_lease = options_.on_lease_expiry == LeaseExpiry::reexecute;
  return request;
}

std::variant<Consumer::Held, MessageOutcome> Consumer::claim_answer(ClaimResult claimed, const Fence& fence,
                                                                    TimePoint lease_expires) {
  MessageOutcome outcome;
  switch (claimed.status) {
    case ClaimStatus::claimed:
      return Held{fence, lease_expires, claimed.kind, claimed.record.attempt};
    case ClaimStatus::completed:
      outcome.status = MessageStatus::duplicate;
      if (claimed.record.response) outcome.result = std::move(claimed.record.response->body);
      outcome.detail = "processed before; the handler did not run";
      break;
    case ClaimStatus::in_progress:
      outcome.status = MessageStatus::in_progress;
      outcome.detail = "another delivery is processing this message; the handler did not run";
      break;
    case ClaimStatus::outcome_unknown:
      outcome.status = MessageStatus::outcome_unknown;
      outcome.detail =
          "the consumer processing this message stopped before recording it and on_lease_expiry is \"unknown\"; "
          "resolve it with idemctl";
      break;
    case ClaimStatus::mismatch:
      outcome.status = MessageStatus::conflict;
      outcome.detail = "this message id was used before for a message with another payload; the handler did not run";
      break;
  }
  return outcome;
}

StoreResult<std::variant<Consumer::Held, MessageOutcome>> Consumer::claim(std::string_view message_id,
                                                                          std::string_view payload) {
  if (message_id.empty() || message_id.size() > kMaxMessageId || !all_visible_ascii(message_id)) {
    return invalid_id(message_id);
  }
  ClaimRequest request = claim_request(message_id, payload);
  const Fence fence{request.id, request.token};
  const TimePoint lease_expires = request.lease_expires;
  auto claimed = BlockingStore(*store_).claim(std::move(request));
  if (!claimed) return std::unexpected(std::move(claimed.error()));
  return claim_answer(std::move(*claimed), fence, lease_expires);
}

std::vector<StoreResult<std::variant<Consumer::Held, MessageOutcome>>> Consumer::claim_many(
    const std::vector<Message>& messages) {
  std::vector<StoreResult<std::variant<Held, MessageOutcome>>> answers(messages.size());
  std::vector<ClaimRequest> requests;
  std::vector<std::size_t> asked;  // which message each request is
  requests.reserve(messages.size());
  for (std::size_t i = 0; i < messages.size(); ++i) {
    const std::string_view id = messages[i].id;
    if (id.empty() || id.size() > kMaxMessageId || !all_visible_ascii(id)) {
      answers[i] = invalid_id(id);
      continue;
    }
    requests.push_back(claim_request(id, messages[i].payload));
    asked.push_back(i);
  }
  if (requests.empty()) return answers;
  std::vector<std::pair<Fence, TimePoint>> fences;
  fences.reserve(requests.size());
  for (const ClaimRequest& r : requests) fences.emplace_back(Fence{r.id, r.token}, r.lease_expires);
  auto claimed = BlockingStore(*store_).claim_many(std::move(requests));
  for (std::size_t j = 0; j < asked.size(); ++j) {
    StoreResult<std::variant<Held, MessageOutcome>>& answer = answers[asked[j]];
    if (j >= claimed.size()) {  // a store that broke the one-answer-per-item rule
      answer = std::unexpected(StoreError{StoreErrc::internal, "the store answered fewer claims than it was asked", false});
    } else if (!claimed[j]) {
      answer = std::unexpected(std::move(claimed[j].error()));
    } else {
      answer = claim_answer(std::move(*claimed[j]), fences[j].first, fences[j].second);
    }
  }
  return answers;
}

BatchResults<FenceStatus> Consumer::complete_many(std::vector<CompleteRequest> completions) {
  return BlockingStore(*store_).complete_many(std::move(completions));
}

CompleteRequest Consumer::completion(const Held& held, std::string result) const {
  CompleteRequest request;
  request.fence = held.fence;
  request.response.status = 200;
  request.response.body = std::move(result);
  request.now = now();
  request.expires = request.now + options_.retention;
  return request;
}

StoreResult<FenceStatus> Consumer::release(const Held& held) { return BlockingStore(*store_).release(held.fence); }

MessageOutcome Consumer::handler_failed(const Held& held, std::string detail) {
  MessageOutcome outcome{MessageStatus::handler_failed, std::string(), std::move(detail)};
  if (auto released = release(held); !released) note_release_failure(outcome, released.error());
  return outcome;
}

StoreResult<MessageOutcome> Consumer::process_once(std::string_view message_id, std::string_view payload,
                                                   MessageHandler handler) {
  auto claimed = claim(message_id, payload);
  if (!claimed) return std::unexpected(std::move(claimed.error()));
  if (auto* outcome = std::get_if<MessageOutcome>(&*claimed)) return std::move(*outcome);
  const Held held = std::get<Held>(*claimed);

  std::expected<std::string, std::string> ran;
  try {
    ran = handler();
  } catch (...) {
    (void)release(held);  // best effort: if it fails, the lease runs out instead
    throw;
  }
  if (!ran) return handler_failed(held, std::move(ran.error()));
  // The effect happened: whatever the store answers now, never release (a retry would run it
  // again); a failed completion leaves the record as the store has it.
  std::string result = *ran;
  auto completed = BlockingStore(*store_).complete(completion(held, std::move(*ran)));
  return completion_outcome(completed, std::move(result), kLostAfterEffect);
}

StoreResult<MessageOutcome> Consumer::process_once_with(
    std::string_view message_id, std::string_view payload,
    std::move_only_function<StoreResult<FenceStatus>(CompleteRequest, bool& declined)> complete) {
  auto claimed = claim(message_id, payload);
  if (!claimed) return std::unexpected(std::move(claimed.error()));
  if (auto* outcome = std::get_if<MessageOutcome>(&*claimed)) return std::move(*outcome);
  const Held held = std::get<Held>(*claimed);

  bool declined = false;
  auto completed = complete(completion(held, std::string()), declined);
  if (declined) return handler_failed(held, completed ? std::string("the handler declined") : completed.error().message);
  if (!completed) {
    // Not in doubt: nothing committed, so the next delivery may run it at once.
    if (!completed.error().in_doubt) (void)release(held);
    return std::unexpected(std::move(completed.error()));
  }
  return completion_outcome(completed, std::string(), kLostRolledBack);
}

std::vector<StoreResult<MessageOutcome>> Consumer::process_batch_with(
    const std::vector<Message>& messages,
    std::move_only_function<BatchResults<WorkResult>(std::vector<CompleteRequest>, const std::vector<std::size_t>&)>
        complete) {
  auto claims = claim_many(messages);
  std::vector<StoreResult<MessageOutcome>> outcomes(messages.size());
  std::vector<Held> held;
  std::vector<std::size_t> indexes;  // which message each held one is
  std::vector<CompleteRequest> completions;
  for (std::size_t i = 0; i < messages.size(); ++i) {
    if (!claims[i]) {
      outcomes[i] = std::unexpected(std::move(claims[i].error()));
    } else if (auto* outcome = std::get_if<MessageOutcome>(&*claims[i])) {
      outcomes[i] = std::move(*outcome);
    } else {
      held.push_back(std::get<Held>(*claims[i]));
      indexes.push_back(i);
      completions.push_back(completion(held.back(), std::string()));
    }
  }
  if (held.empty()) return outcomes;

  auto answers = complete(std::move(completions), indexes);
  std::vector<Fence> forget;
  std::vector<std::size_t> forgotten;  // which message each fence to forget is
  for (std::size_t j = 0; j < held.size(); ++j) {
    StoreResult<WorkResult> answer =
        j < answers.size() ? std::move(answers[j])
                           : std::unexpected(StoreError{StoreErrc::internal,
                                                        "the store answered fewer completions than it was asked", false});
    // Declined: nothing of it committed. A failure not in doubt: nothing committed either. Both
    // are forgotten so that the next delivery runs them at once; in doubt, the record stays.
    const bool declined = answer && answer->status == WorkStatus::declined;
    if (declined || (!answer && !answer.error().in_doubt)) {
      forget.push_back(held[j].fence);
      forgotten.push_back(indexes[j]);
    }
    outcomes[indexes[j]] = work_outcome(std::move(answer));
  }
  if (forget.empty()) return outcomes;
  auto released = BlockingStore(*store_).release_many(std::move(forget));
  for (std::size_t k = 0; k < forgotten.size(); ++k) {
    StoreResult<MessageOutcome>& outcome = outcomes[forgotten[k]];
    if (!outcome || k >= released.size() || released[k]) continue;
    note_release_failure(*outcome, released[k].error());
  }
  return outcomes;
}

}  // namespace idem
