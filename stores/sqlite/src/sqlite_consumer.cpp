#include "idem/sqlite_consumer.hpp"

namespace idem {

StoreResult<MessageOutcome> process_once_in_transaction(Consumer& consumer, SqliteStore& store,
                                                        std::string_view message_id, std::string_view payload,
                                                        SqliteWork work) {
  return detail::process_once_in_transaction(consumer, store, message_id, payload, work);
}

std::vector<StoreResult<MessageOutcome>> process_batch_in_transaction(Consumer& consumer, SqliteStore& store,
                                                                      const std::vector<Consumer::Message>& messages,
                                                                      SqliteBatchWork work) {
  return detail::process_batch_in_transaction<SqliteWorkItem>(consumer, store, messages, work);
}

}  // namespace idem
