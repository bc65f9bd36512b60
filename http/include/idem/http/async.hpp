#pragma once

// Boost 1.74's asio/awaitable.hpp uses std::exchange without including <utility>.
#include <utility>

#include <boost/asio/associated_executor.hpp>
#include <boost/asio/async_result.hpp>
#include <boost/asio/execution/outstanding_work.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/prefer.hpp>

#include <cstddef>
#include <string>

#include "idem/engine.hpp"
#include "idem/store.hpp"

// Asio adapters over the callback-based Engine and Store, usable with any completion token:
//
//   idem::Decision d = co_await idem::http::async_begin(engine, policy, view, tenant,
//                                                       boost::asio::use_awaitable);
//
// Store callbacks may run on any thread (SQLite's writer thread) or inline, before the call
// returns (the memory store). Either way the completion is posted to the handler's associated
// executor, so a coroutine always resumes on its own executor and never inside the store call.
// Until then the executor's context counts the operation as outstanding work, so an io_context
// does not run out of work while only a store thread holds the continuation. No thread blocks.
//
// References (engine, policy, request, ticket, store) are used when the operation starts, which
// for use_awaitable is when it is co_awaited: co_await the result in the same expression. Values
// (tenant, response) are copied or moved when the function is called. Parameters are views and
// references rather than values so that no object with a destructor is a temporary living
// across the co_await (GCC 12 destroys some of those twice).

namespace idem::http {

namespace detail {

/// A store callback, callable with a T on any thread: it posts `fn(value)` to `ex`, never runs it
/// inline. Until then `ex`'s context counts the operation as outstanding work.
template <class T, class Executor, class Fn>
auto posting_callback(const Executor& ex, Fn fn) {
  namespace asio = boost::asio;
  // The tracked executor is the work guard: it keeps the context running until the value has
  // been posted to it.
  auto work = asio::prefer(ex, asio::execution::outstanding_work.tracked);
  return [fn = std::move(fn), work = std::move(work)](T value) mutable {
    // Posted through an untracked copy: `work`, moved into the posted function, already counts
    // the operation until `fn` has run.
    auto untracked = asio::prefer(work, asio::execution::outstanding_work.untracked);
    asio::post(untracked, [fn = std::move(fn), work = std::move(work), value = std::move(value)]() mutable {
      std::move(fn)(std::move(value));
    });
  };
}

/// Starts `start(callback)` and completes `token` with the value the callback receives, on the
/// handler's associated executor.
template <class T, class Token, class Start>
auto async_from_callback(Start start, Token&& token) {
  return boost::asio::async_initiate<Token, void(T)>(
      [](auto handler, Start start) {
        const auto ex = boost::asio::get_associated_executor(handler);
        std::move(start)(posting_callback<T>(ex, std::move(handler)));
      },
      token, std::move(start));
}

}  // namespace detail

/// Engine::begin as an Asio operation; completes with the Decision (signature void(Decision)).
template <class Token>
auto async_begin(Engine& engine, const Policy& policy, const RequestView& request, std::string_view tenant,
                 Token&& token) {
  return detail::async_from_callback<Decision>(
      [engine = &engine, policy = &policy, request = &request, tenant = std::string(tenant)](auto done) mutable {
        engine->begin(*policy, *request, std::move(tenant), std::move(done));
      },
      std::forward<Token>(token));
}

/// Engine::finish as an Asio operation; completes with StoreResult<FinishStatus>.
template <class Token>
auto async_finish(Engine& engine, const Ticket& ticket, StoredResponse&& response, Token&& token) {
  return detail::async_from_callback<StoreResult<FinishStatus>>(
      [engine = &engine, ticket = &ticket, response = std::move(response)](auto done) mutable {
        engine->finish(*ticket, std::move(response), std::move(done));
      },
      std::forward<Token>(token));
}

/// Engine::release as an Asio operation; completes with StoreResult<FinishStatus>.
template <class Token>
auto async_release(Engine& engine, const Ticket& ticket, Token&& token) {
  return detail::async_from_callback<StoreResult<FinishStatus>>(
      [engine = &engine, ticket = &ticket](auto done) mutable { engine->release(*ticket, std::move(done)); },
      std::forward<Token>(token));
}

/// Store::ping as an Asio operation; completes with StoreResult<Done>.
template <class Token>
auto async_ping(Store& store, Token&& token) {
  return detail::async_from_callback<StoreResult<Done>>(
      [store = &store](auto done) mutable { store->ping(std::move(done)); }, std::forward<Token>(token));
}

/// Store::purge_expired as an Asio operation; completes with StoreResult<std::size_t>.
template <class Token>
auto async_purge_expired(Store& store, TimePoint now, std::size_t limit, Token&& token) {
  return detail::async_from_callback<StoreResult<std::size_t>>(
      [store = &store, now, limit](auto done) mutable { store->purge_expired(now, limit, std::move(done)); },
      std::forward<Token>(token));
}

/// Store::get as an Asio operation; completes with StoreResult<std::optional<Record>>.
template <class Token>
auto async_get(Store& store, RecordId id, Token&& token) {
  return detail::async_from_callback<StoreResult<std::optional<Record>>>(
      [store = &store, id = std::move(id)](auto done) mutable { store->get(std::move(id), std::move(done)); },
      std::forward<Token>(token));
}

}  // namespace idem::http
