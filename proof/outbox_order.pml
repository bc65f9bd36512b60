/*
 * The order of the PostgreSQL transactional outbox per ordering key, checked with spin
 * (docs/design.md, "The outbox order model"): the schema of stores/postgres/src/schema.cpp
 * (kOutboxOrdering), the statements of stores/postgres/src/postgres_outbox.cpp, the loop of
 * relay/src/relay_loop.cpp.
 *
 * Processes: NTX business transactions (the first inserts up to ROWS_A rows, the others up to
 * ROWS_B, each row of one of NKEYS ordering keys), each of which then commits or rolls back, and
 * may roll back at any step (a rollback while it waits for a key's lock is also how PostgreSQL
 * breaks a deadlock between two keys); two relays that claim, publish and settle, each of which
 * may crash once at any step and restarts under a new name (host-pid), so that its old leases are
 * no longer its own; the purge of sent rows; an operator who, once, retries or drops a dead row
 * (idemctl outbox retry / drop).
 *
 * A row's INSERT: the identity column takes the next id, then the BEFORE INSERT trigger takes
 * pg_advisory_xact_lock on the key (held until the transaction ends) and then, in a fresh
 * snapshot (READ COMMITTED: the rows of the transaction it waited for are in it), sets key_seq to
 * 1 + max(key_seq) of the key's rows it sees (committed ones, and its own); the unique index on
 * (ordering_key, key_seq) then refuses a number a row of the key already has (the transaction
 * fails). So a transaction can take a lower id and commit after one with a higher id, and key_seq
 * order is meant to be commit order.
 *
 * A claim (one UPDATE over a SELECT ... FOR UPDATE SKIP LOCKED, READ COMMITTED) is two steps with
 * anything in between. First, on the statement's snapshot, the pending rows whose lease is free
 * and that no row of their key with a smaller key_seq holds back: pending (in flight or not), or
 * dead (the "hold" policy; dead_rows_pass, which gives the order up, is not modelled). Then each of
 * those rows is locked and its own conditions (pending, lease free) are checked again on its latest
 * version (EvalPlanQual), the earlier-row test is not read again, and the rows that pass are
 * leased to the relay. The relay publishes each row of its batch, in id order; the broker appends
 * it to the key's log, which the model checks. A publish is confirmed; or fails after the broker
 * took it (the confirm lost); or fails with nothing taken; and either failure may be the last
 * attempt (dead). Then the relay settles the batch in one transaction: sent, pending again
 * (retried later) or dead, each only if the row is still pending and leased to it.
 *
 * Assumed: a lease runs out only after its holder crashed, and a crashed relay's leases count as
 * run out from the crash on (waiting for the clock only delays the claims that take its rows). A
 * claim or a settle that fails (or whose answer is lost) leaves the rows leased to a relay that
 * does not know it holds them: to the table that is a crash after the claim, before the settle.
 * A relay stalled longer than its lease (or a clock skewed past it, or a publish still on the wire
 * when its relay died) is out of the main model: another relay takes the row, publishes it and the
 * key's next rows, and the stalled publish lands later, a duplicate of an earlier row after a later
 * one, which consumers drop by message id. -DSTALL checks that: leases of live relays run out at
 * any moment; (1)'s first publishes stay in commit order, the late duplicate happens (witness 6),
 * and so does one thing more: a row that went dead under the second relay and that an operator
 * dropped is delivered late by the stalled one, for the first time, after later rows (witness 8).
 * Rows without an ordering key, the backoff (next_attempt) and a batch's size limit are left out:
 * they promise no order, or only delay a claim.
 *
 * Properties, for each key (assertions on ghost state, which no step of the protocol reads):
 *   (1) the first publish of each row comes after the first publish of every row of its key that
 *       committed before it (unless an operator dropped that one), and before any of those that
 *       committed after it: commit order, recorded at each commit (ord[]), never read from
 *       key_seq; and the key's log never goes back: a message is the last one again (a
 *       duplicate) or a later row (not with -DSTALL);
 *   (2) at most one row of the key is in flight: claimed and not settled by a live relay (not
 *       with -DSTALL); without a stall a relay settles only rows still leased to it;
 *   (3) no row is published before its transaction committed, and none after it was dropped;
 *   (4) once nothing can happen any more (timeout), every committed row was published and is sent
 *       (or purged), unless it or an earlier row of its key is dead, or it was dropped;
 *   and under READ COMMITTED with the lock, the unique index never refuses a row.
 *
 * Build flags (scripts/lib/proof.sh runs the combinations it checks):
 *   -DNTX=n -DROWS_A=n -DROWS_B=n -DNKEYS=n   bounds (defaults below; at most 7 rows, 2 keys)
 *   -DNO_PURGE             no purge of sent rows
 *   -DNO_DEAD              no publish is the last attempt: no dead rows, no operator
 *   -DSTALL                a live relay's lease runs out at any moment (see above)
 *   -DREPEATABLE_READ      the business transactions run at REPEATABLE READ: the trigger's
 *                          max(key_seq) reads the snapshot of the transaction's first statement
 *                          (kept by the unique index while no row is deleted: -DNO_PURGE
 *                          -DNO_DEAD; refuted with the purge, or with an operator's drop)
 *   -DORDER_ONLY           (2) is not asserted: a seeded bug must then break the order itself
 *   -DBUG_ORDER_BY_ID      seeded bug: the claim's earlier-row test compares ids, not key_seq
 *   -DBUG_NO_KEY_LOCK      seeded bug: the trigger takes no lock; key_seq from the rows it sees,
 *                          with only the unique index between concurrent inserts
 *   -DWITNESS=n            reachability check n (listed at the end): asserts that an event never happens,
 *                          so spin must find a run where it does; proves the model reaches it
 */

#ifndef NTX
#define NTX 3
#endif
#ifndef ROWS_A
#define ROWS_A 2
#endif
#ifndef ROWS_B
#define ROWS_B 1
#endif
#ifndef NKEYS
#define NKEYS 1
#endif
#ifndef WITNESS
#define WITNESS 0
#endif

#define NRELAY 2
#define ROWS(t) (t == 1 -> ROWS_A : ROWS_B)
#define MAXID  (ROWS_A + (NTX - 1) * ROWS_B)  /* ids 1..MAXID; a mask of ids is a byte: <= 7 */
#define BIT(i) (1 << (i))

/* A row's state. */
#define NONE        0  /* id not taken yet, or the row is gone: rolled back, purged or dropped */
#define UNCOMMITTED 1  /* inserted by a transaction still open: no other transaction sees it */
#define PENDING     2
#define SENT        3
#define DEAD        4

/* ---- the table (rows indexed by id) and the locks ------------------------------------------ */
byte r_st[8];
byte r_key[8];           /* ordering_key, 1..NKEYS */
byte r_seq[8];           /* key_seq */
byte r_owner[8];         /* lease_owner: relay r is r, then r + NRELAY after its crash; 0: none */
#ifdef STALL
bool r_expired[8];       /* lease_expires <= now under a live owner */
#endif
bool alive[2 * NRELAY + 1];
byte next_id = 1;        /* the identity sequence */
byte key_lock[NKEYS + 1];/* the transaction holding the key's advisory lock, 0: none */
byte ops = 1;            /* operator actions left */
byte open_tx = NTX;      /* transactions not ended yet: only their INSERTs can tell a purged row */

/* ---- ghost state: what the properties talk about; no step of the protocol reads it ------- */
byte ord[8];             /* the row's place among its key's rows in commit order, 0: uncommitted */
byte published;          /* rows the broker has (at least once) */
byte dropped;            /* rows an operator dropped */
#if WITNESS == 2
byte crash_pub;          /* rows a relay published and died before settling */
#define TOOK(i) pubd = pubd | BIT(i)
#else
#define TOOK(i) skip
#endif
#if WITNESS == 5
byte held_once;          /* rows that were pending behind a dead row an operator retried */
#define HELD_ONCE(i) \
  for (j_ : 1 .. MAXID) { \
    if :: r_st[j_] == PENDING && DEAD_BEFORE(i, j_) -> held_once = held_once | BIT(j_) :: else -> skip fi \
  }
#else
#define HELD_ONCE(i) skip
#endif
/* -DWITNESS=n: whether event n happened. One flag, set by that event only: a flag per event,
 * set in every run, would multiply the states by each. */
bool seen;
#define SAW(n) seen = seen || WITNESS == n

/* Scratch of one indivisible step (d_step): never read across steps, so kept out of the state. */
hidden byte i_, j_, k_, s_, n_;
hidden byte in_flight;   /* rows of a key in flight */
hidden byte log_last;    /* the ord of the last message in a key's log */
hidden byte held_back;   /* a row is held back by a dead one */
hidden byte b_;

#ifdef BUG_ORDER_BY_ID
#define EARLIER(j, i) ((j) < (i))
#else
#define EARLIER(j, i) (r_seq[j] < r_seq[i])
#endif

#ifdef STALL
#define LEASE_FREE(i) (r_owner[i] == 0 || !alive[r_owner[i]] || r_expired[i])
#else
#define LEASE_FREE(i) (r_owner[i] == 0 || !alive[r_owner[i]])
#endif
#define IN_FLIGHT(i)  (r_st[i] == PENDING && r_owner[i] != 0 && alive[r_owner[i]])

/* Row j is dead and holds row i back. */
#define DEAD_BEFORE(j, i) (r_st[j] == DEAD && r_key[j] == r_key[i] && EARLIER(j, i))
#define HELD(i) (DEAD_BEFORE(1, i) || DEAD_BEFORE(2, i) || DEAD_BEFORE(3, i) || DEAD_BEFORE(4, i) || \
                 DEAD_BEFORE(5, i) || DEAD_BEFORE(6, i) || DEAD_BEFORE(7, i))
/* Row i is for a relay to consider: pending, lease free, not held back by a dead row. A relay
 * polls while some row is (it may find an earlier row in flight: an empty claim); with none it
 * sleeps, which lets the end-state check (4) run once nothing else can. */
#define WORK(i) (r_st[i] == PENDING && LEASE_FREE(i) && !HELD(i))
#define ANY_WORK (WORK(1) || WORK(2) || WORK(3) || WORK(4) || WORK(5) || WORK(6) || WORK(7))

/* ---- the business transactions -------------------------------------------------------------- */

/* The trigger, once the lock is held (or without it): key_seq = 1 + max(key_seq) of the key's
 * rows the transaction sees, its own included. */
inline number_row(id, k, mine, snap) {
  s_ = 0;
  for (j_ : 1 .. MAXID) {
    if
#ifdef REPEATABLE_READ
    /* the rows that had committed at its first statement (deleted since or not), and its own */
    :: r_key[j_] == k && ((snap & BIT(j_)) || (mine & BIT(j_))) && r_seq[j_] > s_ -> s_ = r_seq[j_]
#else
    /* a fresh snapshot: the committed rows there are now, and its own */
    :: r_key[j_] == k && (r_st[j_] >= PENDING || (mine & BIT(j_))) && r_seq[j_] > s_ -> s_ = r_seq[j_]
#endif
    :: else -> skip
    fi
  };
  s_++;
  /* witness 7: a key's rows all purged, its numbers start again */
  for (j_ : 1 .. MAXID) {
    if :: s_ == 1 && ord[j_] != 0 && r_key[j_] == k -> SAW(7) :: else -> skip fi
  };
  /* the unique index (ordering_key, key_seq), over every row there is, committed or not. An
   * insert that meets another transaction's uncommitted number waits for that one's end and
   * fails if it commits; here it fails at once, and the wait that ends in a rollback is the same
   * insert made after it. (Only without the lock, or with an old snapshot, can a number clash.) */
  b_ = false;
  for (j_ : 1 .. MAXID) {
    if
    :: r_st[j_] != NONE && r_key[j_] == k && r_seq[j_] == s_ -> b_ = true
    :: else -> skip
    fi
  };
#if !defined(REPEATABLE_READ) && !defined(BUG_NO_KEY_LOCK)
  /* under the lock, a fresh snapshot sees every row there is of the key */
  assert(!b_);
#endif
  if
  :: !b_ -> r_st[id] = UNCOMMITTED; r_key[id] = k; r_seq[id] = s_; mine = mine | BIT(id)
  :: else -> skip  /* unique_violation: the transaction fails (b_ tells the caller) */
  fi
}

/* The transaction's end: commit or rollback (its rows vanish); either releases its locks. */
inline commit_tx(t, mine) {
  for (i_ : 1 .. MAXID) {
    if
    :: mine & BIT(i_) ->
       k_ = r_key[i_];
       /* witness: a row of the key with a higher id (another transaction's) committed first */
       for (j_ : i_ + 1 .. MAXID) {
         if :: ord[j_] != 0 && r_key[j_] == k_ && !(mine & BIT(j_)) -> SAW(1) :: else -> skip fi
       }
    :: else -> skip
    fi
  };
  /* the commit order, kept apart from key_seq; ids grow with the inserts, so within one
   * transaction id order is insert order */
  for (i_ : 1 .. MAXID) {
    if
    :: mine & BIT(i_) ->
       k_ = r_key[i_]; r_st[i_] = PENDING;
       n_ = 0;
       for (j_ : 1 .. MAXID) {
         if :: ord[j_] != 0 && r_key[j_] == k_ -> n_++ :: else -> skip fi
       };
       ord[i_] = n_ + 1; n_ = 0
    :: else -> skip
    fi
  };
  release_locks(t)
}
inline rollback_tx(t, mine) {
  for (i_ : 1 .. MAXID) {
    if :: mine & BIT(i_) -> r_st[i_] = NONE; r_key[i_] = 0; r_seq[i_] = 0 :: else -> skip fi
  };
  release_locks(t)
}
inline release_locks(t) {
  for (i_ : 1 .. NKEYS) {
    if :: key_lock[i_] == t -> key_lock[i_] = 0 :: else -> skip fi
  }
}

proctype tx(byte t) {
  byte mine;   /* the ids of its rows */
  byte n, k, id;
  byte snap;   /* REPEATABLE_READ: the rows committed when its first statement ran */
  bool gone;   /* the unique index refused a row: the transaction failed */
#ifdef REPEATABLE_READ
  d_step {
    for (i_ : 1 .. MAXID) {
      if :: r_st[i_] >= PENDING -> snap = snap | BIT(i_) :: else -> skip fi
    }
  };
#endif
  do
  :: n < ROWS(t) && !gone ->
     /* INSERT: the identity takes the id first, then the trigger runs */
     atomic {
       id = next_id; next_id++; n++;
       if
       :: k = 1
       :: NKEYS > 1 -> k = 2
       fi
     };
     if
     :: d_step {
#ifndef BUG_NO_KEY_LOCK
          key_lock[k] == 0 || key_lock[k] == t ->
          key_lock[k] = t;
#endif
          number_row(id, k, mine, snap);
          if
          :: b_ -> rollback_tx(t, mine); gone = true  /* the unique index refused it */
          :: else -> skip
          fi;
          b_ = false; id = 0; k = 0
        }
     :: /* while it waits: a client gone, a deadlock broken, any error */
        d_step { rollback_tx(t, mine); open_tx--; mine = 0; n = 0; k = 0; id = 0; snap = 0 };
        break
     fi
  :: n > 0 && !gone -> d_step { commit_tx(t, mine); open_tx--; mine = 0; n = 0; k = 0; id = 0; snap = 0 }; break
  :: n > 0 && !gone -> d_step { rollback_tx(t, mine); open_tx--; mine = 0; n = 0; k = 0; id = 0; snap = 0 }; break
  :: gone -> d_step { open_tx--; mine = 0; n = 0; k = 0; id = 0; snap = 0; gone = false }; break
  od
}

/* ---- the broker: one log per key -------------------------------------------------------------- */
inline append(i) {
  k_ = r_key[i];
  /* (3) nothing is published before its transaction committed */
  assert(ord[i] != 0);
#ifndef STALL
  /* a relay publishes only rows it holds: pending, and never dropped */
  assert(r_st[i] == PENDING && !(dropped & BIT(i)));
#endif
  if
#ifdef STALL
  :: !(published & BIT(i)) && (dropped & BIT(i)) ->
     /* a stalled relay's publish of a row that went dead under another relay and was dropped:
      * its first delivery, after later rows of its key maybe (witness 8) */
     published = published | BIT(i);
     for (j_ : 1 .. MAXID) {
       if :: ord[j_] > ord[i] && r_key[j_] == k_ && (published & BIT(j_)) -> SAW(8) :: else -> skip fi
     }
  :: !(published & BIT(i)) && !(dropped & BIT(i)) ->
#else
  :: !(published & BIT(i)) ->
#endif
     /* (1) the first publish: after every row of the key that committed before it, before any
      * that committed after it */
     for (j_ : 1 .. MAXID) {
       if
       :: ord[j_] != 0 && r_key[j_] == k_ && ord[j_] < ord[i] -> assert((published | dropped) & BIT(j_))
       :: ord[j_] != 0 && r_key[j_] == k_ && ord[j_] > ord[i] -> assert(!(published & BIT(j_)))
       :: else -> skip
       fi
     };
     published = published | BIT(i);
#if WITNESS == 5
     if :: held_once & BIT(i) -> SAW(5) :: else -> skip fi;
#endif
     skip
  :: else ->
#if WITNESS == 2
     if :: crash_pub & BIT(i) -> SAW(2) :: else -> skip fi
#endif
     skip
  fi;
  /* the key's log so far: the last message is the greatest ord published (inductively, below) */
  log_last = 0;
  for (j_ : 1 .. MAXID) {
    if
    :: j_ != i && (published & BIT(j_)) && r_key[j_] == k_ && ord[j_] > log_last -> log_last = ord[j_]
    :: else -> skip
    fi
  };
#ifdef STALL
  if :: ord[i] < log_last -> SAW(6) :: else -> skip fi;
#else
  /* (1) the log never goes back: a duplicate only of the key's last message */
  assert(ord[i] >= log_last);
#endif
  log_last = 0
}

/* ---- the relays ------------------------------------------------------------------------------- */
proctype relay(byte me) {
  byte cand;   /* rows the claim's snapshot selected */
  byte todo;   /* rows of the batch not published yet */
  byte batch, ok, dead, i;
  byte pubd;   /* rows of the batch the broker took (-DWITNESS=2 only) */
end:
  do
  :: /* the claim, 1: the rows its snapshot selects */
     d_step {
       ANY_WORK ->
       for (i_ : 1 .. MAXID) {
         if
         :: r_st[i_] == PENDING && LEASE_FREE(i_) ->
            b_ = false;
            for (j_ : 1 .. MAXID) {
              if
              :: j_ != i_ && r_key[j_] == r_key[i_] && EARLIER(j_, i_) &&
                 (r_st[j_] == PENDING || r_st[j_] == DEAD) ->
                 b_ = true;
                 if :: IN_FLIGHT(j_) -> SAW(3) :: else -> skip fi
              :: else -> skip
              fi
            };
            if :: !b_ -> cand = cand | BIT(i_) :: else -> skip fi
         :: else -> skip
         fi
       };
       b_ = false
     };
#if NKEYS > 1
     /* SKIP LOCKED (a row another transaction holds at this instant), LIMIT, a row not due
      * yet: the claim may leave out any of them (with one key there is at most one) */
     atomic {
       for (i : 1 .. MAXID) {
         if
         :: cand & BIT(i) -> if :: skip :: cand = cand & ~BIT(i) fi
         :: else -> skip
         fi
       };
       i = 0
     };
#endif
     /* the claim, 2: lock each row, check its own conditions on its latest version, lease it */
     d_step {
       for (i_ : 1 .. MAXID) {
         if
         :: (cand & BIT(i_)) && r_st[i_] == PENDING && LEASE_FREE(i_) ->
            r_owner[i_] = me;
#ifdef STALL
            r_expired[i_] = false;
#endif
            batch = batch | BIT(i_)
         :: else -> skip
         fi
       };
       cand = 0;
       todo = batch;
#if !defined(STALL) && !defined(ORDER_ONLY)
       /* (2) at most one row of a key in flight */
       for (k_ : 1 .. NKEYS) {
         in_flight = 0;
         for (i_ : 1 .. MAXID) {
           if :: IN_FLIGHT(i_) && r_key[i_] == k_ -> in_flight++ :: else -> skip fi
         };
         assert(in_flight <= 1)
       };
       in_flight = 0
#endif
     };
     do
     :: todo != 0 ->
        /* publish the batch's next row, in id order */
        atomic {
          i = 1;
          do
          :: todo & BIT(i) -> break
          :: else -> i++
          od;
          todo = todo & ~BIT(i);
          if
          :: d_step { append(i); TOOK(i); ok = ok | BIT(i) }  /* confirmed */
          :: d_step { append(i); TOOK(i) }  /* taken, the confirm lost: failed */
          :: skip                                          /* refused, nothing taken: failed */
#ifndef NO_DEAD
          :: d_step { append(i); TOOK(i); dead = dead | BIT(i) }  /* same, last try */
          :: dead = dead | BIT(i)                          /* same, last try (or rejected) */
#endif
          fi;
          i = 0
        }
     :: todo == 0 && batch == 0 -> break  /* an empty claim */
     :: todo == 0 && batch != 0 ->
        /* settle, one transaction: each row only if still pending and leased to this relay */
        d_step {
          for (i_ : 1 .. MAXID) {
            if
            :: batch & BIT(i_) ->
#ifndef STALL
               /* without a stall, a live relay's leases are its own until it settles */
               assert(r_st[i_] == PENDING && r_owner[i_] == me);
#endif
               if
               :: r_st[i_] == PENDING && r_owner[i_] == me ->
                  r_owner[i_] = 0;
#ifdef STALL
                  r_expired[i_] = false;
#endif
                  if
                  :: ok & BIT(i_) -> assert(published & BIT(i_)); r_st[i_] = SENT
                  :: dead & BIT(i_) -> r_st[i_] = DEAD
                  :: else -> skip  /* pending again: retried later */
                  fi
               :: else -> skip
               fi
            :: else -> skip
            fi
          };
          batch = 0; pubd = 0; ok = 0; dead = 0
        };
        break
     :: batch != 0 && me <= NRELAY ->
        /* a crash after the claim, between publishes or before the settle: its memory is gone,
         * its leases run out, it restarts under a new name */
        d_step {
#if WITNESS == 2
          crash_pub = crash_pub | pubd;
#endif
          alive[me] = false;
          me = me + NRELAY;
          alive[me] = true;
          batch = 0; todo = 0; pubd = 0; ok = 0; dead = 0
        };
        break
     od
  od
}

/* ---- purge, operator, clock ------------------------------------------------------------------ */

/* purge_sent: deletes sent rows, any of them at any moment (sent_ms older than the retention).
 * Only a later INSERT's trigger (max(key_seq), the unique index) tells a purged row from a sent
 * one, so once every transaction has ended the purge stops: the same runs, fewer states. */
#define PURGE(i) :: d_step { r_st[i] == SENT && open_tx > 0 -> r_st[i] = NONE }
proctype purge() {
end:
  do
  PURGE(1) PURGE(2) PURGE(3) PURGE(4) PURGE(5) PURGE(6) PURGE(7)
  od
}

/* idemctl outbox retry / drop, on a dead row, once. */
#define OPERATE(i) \
  :: d_step { r_st[i] == DEAD && ops > 0 -> ops--; HELD_ONCE(i); r_st[i] = PENDING } \
  :: d_step { r_st[i] == DEAD && ops > 0 -> ops--; r_st[i] = NONE; dropped = dropped | BIT(i) }
proctype operator() {
end:
  do
  OPERATE(1) OPERATE(2) OPERATE(3) OPERATE(4) OPERATE(5) OPERATE(6) OPERATE(7)
  od
}

#ifdef STALL
/* A live relay's lease runs out while it stalls. */
#define EXPIRE(i) :: d_step { r_st[i] == PENDING && r_owner[i] != 0 && !r_expired[i] -> r_expired[i] = true }
proctype clock() {
end:
  do
  EXPIRE(1) EXPIRE(2) EXPIRE(3) EXPIRE(4) EXPIRE(5) EXPIRE(6) EXPIRE(7)
  od
}
#endif

/* (4) once nothing can happen any more, every committed row is published and sent (or purged),
 * unless it or an earlier row of its key is dead, or an operator dropped it. */
proctype quiescence() {
  timeout ->
  d_step {
    for (i_ : 1 .. MAXID) {
      if
      :: ord[i_] != 0 && !(dropped & BIT(i_)) ->
         assert(r_st[i_] != UNCOMMITTED);
         if
         :: r_st[i_] == SENT || r_st[i_] == NONE -> assert(published & BIT(i_))
         :: r_st[i_] == DEAD -> skip
         :: r_st[i_] == PENDING -> held_back = HELD(i_); assert(held_back); held_back = 0; SAW(4)
         fi
      :: else -> skip
      fi
    }
  }
}

init {
  byte t;
  atomic {
    assert(MAXID <= 7 && NKEYS <= 2);
    t = 1;
    do
    :: t <= NTX -> run tx(t); t++
    :: else -> break
    od;
    t = 1;
    do
    :: t <= NRELAY -> alive[t] = true; run relay(t); t++
    :: else -> break
    od;
    t = 0;
#ifndef NO_PURGE
    run purge();
#endif
#ifndef NO_DEAD
    run operator();
#endif
#ifdef STALL
    run clock();
#endif
    run quiescence()
  }
}

/* Reachability (-DWITNESS=n): each claims an event never happens; spin must refute it. */
/*   1  a lower id commits after a higher id of its key
 *   2  a relay crashes after a publish, before the settle, and the row is published again
 *   3  a claim skips a row because an earlier one of its key is in flight
 *   4  at the end, a row waits behind a dead row of its key (hold)
 *   5  a row held back by a dead one is published once an operator retried that one
 *   6  (-DSTALL) an earlier row's duplicate lands after a later row of its key
 *   7  key_seq starts again at 1 once the key's rows are all purged
 *   8  (-DSTALL) a dropped row's first delivery lands after a later row of its key */
#if WITNESS > 0
active proctype witness() {
end:
  atomic { seen -> assert(false) }
}
#endif
