// SqsSink: OutgoingMessages as SendMessageBatch entries (protocol.hpp), sent through the client's
// I/O thread: several batches at once to standard queues, one at a time when a FIFO queue is
// among them.

#include <algorithm>
#include <map>
#include <set>

#include "client.hpp"
#include "errors.hpp"
#include "idem/redact.hpp"
#include "idem/sqs_broker.hpp"
#include "protocol.hpp"

namespace idem {
namespace {

using namespace sqs_detail;

// SendMessageBatch calls in flight at once on a standard queue.
constexpr std::size_t kParallel = 8;

class SqsSink final : public MessageSink {
 public:
  SqsSink(SqsUrl url, std::string name, SinkSettings settings)
      : url_(std::move(url)), name_(std::move(name)), settings_(settings) {
    settings_.connect_timeout = std::max(settings_.connect_timeout, Millis{100});
    settings_.confirm_timeout = std::max(settings_.confirm_timeout, Millis{100});
    client_ = std::make_unique<Client>(ClientConfig::of(url_, settings_.connect_timeout));
  }

  ~SqsSink() override { client_->stop(); }
  SqsSink(const SqsSink&) = delete;
  SqsSink& operator=(const SqsSink&) = delete;

  /// Checks that the queue exists and the credentials are taken.
  BrokerResult<Done> open() { return check("opening the sink"); }

  std::vector<BrokerResult<Done>> publish(std::span<const OutgoingMessage> messages) override {
    std::vector<BrokerResult<Done>> results(messages.size(), Done{});
    // Each call: the queue it goes to, the messages it carries (their index), and its entries.
    struct Call {
      std::string queue;
      std::vector<std::size_t> messages;
      std::vector<SendEntry> entries;
      std::size_t bytes = 0;
      bool single = false;  // SendMessage: one message over the batch limit
    };
    std::vector<Call> calls;
    std::map<std::string, std::size_t> open;  // the batch still taking messages, by queue
    bool any_fifo = false;
    for (std::size_t i = 0; i < messages.size(); ++i) {
      const OutgoingMessage& m = messages[i];
      if (auto problem = outgoing_problem(m, url_.id_attribute)) {
        results[i] = std::unexpected(rejected(m, *problem));
        continue;
      }
      const std::string& queue = m.destination.empty() ? url_.queue : m.destination;
      const bool fifo = queue.ends_with(".fifo");
      any_fifo = any_fifo || fifo;
      SendEntry e = outgoing_entry(m, url_.id_attribute, fifo, std::string());
      const std::size_t size = e.size();
      if (size > kMaxMessageBytes) {
        results[i] = std::unexpected(rejected(m, "the message is " + std::to_string(size) + " bytes with its attributes; SQS takes " +
                                                     std::to_string(kMaxMessageBytes) + " at most"));
        continue;
      }
      if (size > kMaxBatchBytes) {
        calls.push_back(Call{queue, {i}, {std::move(e)}, size, true});
        open.erase(queue);  // later messages of a FIFO queue must not overtake it
        continue;
      }
      auto at = open.find(queue);
      if (at == open.end() || calls[at->second].entries.size() == kMaxBatchEntries ||
          calls[at->second].bytes + size > kMaxBatchBytes) {
        calls.push_back(Call{queue, {}, {}, 0, false});
        at = open.insert_or_assign(queue, calls.size() - 1).first;
      }
      Call& c = calls[at->second];
      e.id = std::to_string(c.entries.size());
      c.bytes += size;
      c.messages.push_back(i);
      c.entries.push_back(std::move(e));
    }

    auto request_of = [&](const Call& c) {
      const std::string queue_url = url_.endpoint() + url_.account + "/" + c.queue;
      return c.single ? Request{"SendMessage", send_request(queue_url, c.entries.front()), settings_.confirm_timeout}
                      : Request{"SendMessageBatch", send_batch_request(queue_url, c.entries), settings_.confirm_timeout};
    };
    if (!any_fifo) {
      std::vector<Request> requests;
      requests.reserve(calls.size());
      for (const Call& c : calls) requests.push_back(request_of(c));
      const std::vector<Reply> replies = client_->call_all(std::move(requests), kParallel);
      for (std::size_t k = 0; k < calls.size(); ++k) settle(calls[k].queue, calls[k].messages, calls[k].single, replies[k], results);
      return results;
    }
    // FIFO: one call at a time, and none to a FIFO queue after one to it failed: what follows a
    // message that must be sent again would otherwise overtake it.
    std::set<std::string> failed;
    for (const Call& c : calls) {
      if (failed.contains(c.queue)) {
        for (const std::size_t i : c.messages) {
          results[i] = std::unexpected(BrokerError{BrokerErrc::unavailable,
                                                   name_ + ": not sent: an earlier message of this publish to FIFO queue " +
                                                       c.queue + " failed, and it keeps the order in which messages are sent",
                                                   false});
        }
        continue;
      }
      if (!settle(c.queue, c.messages, c.single, client_->call(request_of(c)), results) && c.queue.ends_with(".fifo")) {
        failed.insert(c.queue);
      }
    }
    return results;
  }

  BrokerResult<Done> ping() override { return check("ping"); }

  std::string name() const override { return name_; }

 private:
  // Records one call's outcome for its messages; false when any of them failed.
  bool settle(const std::string& queue, const std::vector<std::size_t>& indexes, bool single, const Reply& reply,
              std::vector<BrokerResult<Done>>& results) {
    const std::string doing = std::string(single ? "sending (SendMessage)" : "sending (SendMessageBatch)") +
                              (queue == url_.queue ? std::string() : " to queue " + queue);
    if (!reply.ok()) {
      const BrokerError e = map_error(prepared(reply.failure(), doing, queue));
      for (const std::size_t i : indexes) results[i] = std::unexpected(e);
      return false;
    }
    if (single) return true;
    auto parsed = parse_batch_result(reply.body);
    if (!parsed) {
      // Sent, and the answer is unreadable: whether SQS has them is not known.
      const BrokerError e{BrokerErrc::internal, name_ + ": " + doing + ": unexpected answer from SQS: " + parsed.error(), true};
      for (const std::size_t i : indexes) results[i] = std::unexpected(e);
      return false;
    }
    bool all = true;
    for (std::size_t k = 0; k < indexes.size(); ++k) {
      const std::string id = std::to_string(k);
      if (auto f = parsed->failed.find(id); f != parsed->failed.end()) {
        Failure failure;
        failure.aws_code = f->second.code;
        failure.aws_message = f->second.message;
        failure.sender_fault = f->second.sender_fault;
        results[indexes[k]] = std::unexpected(map_error(prepared(std::move(failure), doing, queue)));
        all = false;
      } else if (std::find(parsed->successful.begin(), parsed->successful.end(), id) == parsed->successful.end()) {
        results[indexes[k]] = std::unexpected(BrokerError{
            BrokerErrc::internal, name_ + ": " + doing + ": SQS's answer does not mention this message", true});
        all = false;
      }
    }
    return all;
  }

  Failure prepared(Failure f, const std::string& doing, const std::string& queue) const {
    f.where = name_;
    f.doing = doing;
    f.queue = queue;
    f.key_id = url_.access_key_id;
    f.secrets = client_->secrets();
    f.sends = true;
    return f;
  }

  BrokerError rejected(const OutgoingMessage& m, const std::string& problem) const {
    std::string id = "without an id";
    if (!m.message_id.empty()) id = std::string(1, '"').append(sqs_text(m.message_id, 80)).append(1, '"');
    return BrokerError{BrokerErrc::rejected, name_ + ": message " + id + ": " + problem, false};
  }

  BrokerResult<Done> check(const std::string& doing) {
    const Reply r =
        client_->call({"GetQueueAttributes", get_attributes_request(url_.queue_url(), {"QueueArn"}), settings_.confirm_timeout});
    if (r.ok()) return Done{};
    Failure f = prepared(r.failure(), doing, url_.queue);
    f.sends = false;
    // A role allowed only to send may not read attributes: SQS took its credentials, and the
    // queue's existence is told by the first publish.
    if (is_access_denied(f)) return Done{};
    return std::unexpected(map_error(f));
  }

  SqsUrl url_;
  std::string name_;
  SinkSettings settings_;
  std::unique_ptr<Client> client_;
};

}  // namespace

BrokerResult<std::unique_ptr<MessageSink>> open_sqs_sink(std::string_view url, const SinkSettings& settings) {
  auto parsed = parse_complete_sqs_url(url, SqsUrlRole::sink);
  if (!parsed) return std::unexpected(parsed.error());
  auto sink = std::make_unique<SqsSink>(std::move(*parsed), redact_url(url), settings);
  if (auto opened = sink->open(); !opened) return std::unexpected(opened.error());
  return sink;
}

}  // namespace idem
