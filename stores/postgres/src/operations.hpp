#pragma once

// The store's queued operations: one statement that shares a pipelined transaction with others,
// one statement alone, or an interactive transaction; each with its callback, called once after
// its transaction ended.

#include <functional>
#include <memory>
#include <optional>
#include <utility>

#include "connection.hpp"
#include "schema.hpp"
#include "session.hpp"

namespace idem::postgres_detail {

// How an operation meets the server.
enum class OpMode : unsigned char {
  batched,      // one statement, sharing a pipelined transaction with other operations
  alone,        // one statement in a transaction of its own (purge: a big delete delays no request)
  interactive,  // a transaction of several round trips, with decisions between them
};

class Op {
 public:
  Op(OpMode mode, bool writes) : mode_(mode), writes_(writes) {}
  virtual ~Op() = default;
  OpMode mode() const { return mode_; }
  bool writes() const { return writes_; }
  // The operations of one batch call share one transaction: the first one counts them all, the
  // others count 0. A single call's operation counts 1.
  std::size_t group_size() const { return group_size_; }
  void set_group_size(std::size_t size) { group_size_ = size; }

  // The record it touches, for lock ordering within a batch; null when none.
  virtual const RecordId* id() const { return nullptr; }
  // batched and alone: the statement, its parameters, and the reading of its result.
  virtual Stmt stmt() const { return Stmt::ping; }
  virtual const Params* params() const { return nullptr; }
  virtual void accept(const PGresult*) {}
  // interactive: the whole transaction.
  virtual void run(Session&) {}
  // Replaces the outcome with an error.
  virtual void fail(const StoreError& error) = 0;
  // Calls the callback, once.
  virtual void deliver() = 0;

 private:
  OpMode mode_;
  bool writes_;
  std::size_t group_size_ = 1;
};

template <class T>
class TypedOp : public Op {
 public:
  TypedOp(OpMode mode, bool writes, Callback<T> done) : Op(mode, writes), done_(std::move(done)) {}
  void fail(const StoreError& error) override { result_ = std::unexpected(error); }
  void deliver() override {
    if (!result_) result_ = std::unexpected(internal_error("postgres: operation was never run"));
    auto done = std::move(done_);
    if (done) done(std::move(*result_));
  }

 protected:
  Callback<T> done_;
  std::optional<StoreResult<T>> result_;
};

// One statement. The parameters point into the request the operation owns, which never moves.
template <class T, class Req>
class StatementOp final : public TypedOp<T> {
 public:
  using Bind = void (*)(const Req&, Params&);
  using Parse = StoreResult<T> (*)(const Req&, const PGresult*);
  using Key = const RecordId* (*)(const Req&);

  StatementOp(OpMode mode, bool writes, Stmt stmt, Req req, Bind bind, Parse parse, Key key, Callback<T> done)
      : TypedOp<T>(mode, writes, std::move(done)), stmt_(stmt), req_(std::move(req)), parse_(parse), key_(key) {
    bind(req_, params_);
  }
  const RecordId* id() const override { return key_ ? key_(req_) : nullptr; }
  Stmt stmt() const override { return stmt_; }
  const Params* params() const override { return &params_; }
  void accept(const PGresult* r) override { this->result_ = parse_(req_, r); }

 private:
  Stmt stmt_;
  Req req_;
  Params params_;
  Parse parse_;
  Key key_;
};

template <class T>
class InteractiveOp final : public TypedOp<T> {
 public:
  using Body = std::move_only_function<StoreResult<T>(Session&)>;
  InteractiveOp(bool writes, Body body, Callback<T> done)
      : TypedOp<T>(OpMode::interactive, writes, std::move(done)), body_(std::move(body)) {}
  void run(Session& session) override { this->result_ = body_(session); }

 private:
  Body body_;
};

template <class T, class Req>
std::unique_ptr<Op> statement_op(OpMode mode, bool writes, Stmt stmt, Req req,
                                 typename StatementOp<T, Req>::Bind bind, typename StatementOp<T, Req>::Parse parse,
                                 typename StatementOp<T, Req>::Key key, Callback<T> done) {
  return std::make_unique<StatementOp<T, Req>>(mode, writes, stmt, std::move(req), bind, parse, key, std::move(done));
}

}  // namespace idem::postgres_detail
