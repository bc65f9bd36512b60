#include "idem/postgres_consumer.hpp"

namespace idem {

StoreResult<MessageOutcome> process_once_in_transaction(Consumer& consumer, PostgresStore& store,
                                                        std::string_view message_id, std::string_view payload,
                                                        PostgresWork work) {
  return detail::process_once_in_transaction(consumer, store, message_id, payload, work);
}

std::vector<StoreResult<MessageOutcome>> process_batch_in_transaction(Consumer& consumer, PostgresStore& store,
                                                                      const std::vector<Consumer::Message>& messages,
                                                                      PostgresBatchWork work) {
  return detail::process_batch_in_transaction<PostgresWorkItem>(consumer, store, messages, work);
}

}  // namespace idem
