/*
 * idem's protocol for one (tenant, key), checked with spin (docs/design.md, "The model").
 *
 * Processes: two clients (the first request, and a different request under the same key) whose
 * copies reach the network at any moment, are delivered in any order to either gateway or never;
 * two gateways (engine + store client) that take any copy, claim, call the upstream and finish,
 * and can crash at every step; one store whose steps are those of core/src/store.cpp and the
 * backends; a clock that lets leases and retentions run out at any moment; the reaper.
 *
 * Build flags (scripts/lib/proof.sh runs every combination it checks):
 *   -DUNKNOWN_POLICY       on_lease_expiry = "unknown" (default: "reexecute")
 *   -DSTORE_REDIS          claim as RedisStore::claim: SET NX GET, then claim.lua if claimable
 *   -DSTORE_POSTGRES       claim as idem_claim(): INSERT ON CONFLICT, read, locked re-read
 *                          (default: one atomic step, as the memory store's shard mutex and
 *                          SQLite's BEGIN IMMEDIATE transaction)
 *   -DBUG_NO_FENCE         seeded bug: complete ignores the fencing token
 *   -DBUG_SPLIT_CLAIM      seeded bug: the claim reads, decides, then writes in a later step
 *   -DWITNESS=n            reachability check n (below): asserts that an event never happens,
 *                          so spin must find a run where it does; proves the model reaches it
 *   -DNREQ_A=n -DNREQ_B=n  copies of each request (bounds; defaults below)
 */

#ifndef NREQ_A
#define NREQ_A 3
#endif
#ifndef NREQ_B
#define NREQ_B 1
#endif
#ifndef WITNESS
#define WITNESS 0
#endif

#define NTOK   (NREQ_A + NREQ_B + 1)  /* tokens 1..NREQ_A+NREQ_B: one per claim attempt */
#define NLIFE  (NREQ_A + NREQ_B + 1)  /* lives 1..: at most one begins per claim */

/* Request fingerprints: the first request and a different one under the same key. */
#define A 1
#define B 2

/* RecordState, and no record. */
#define ABSENT 0
#define INPROG 1
#define DONE   2
#define FAILED 3

/* ClaimStatus, plus STORE_ERROR: a claim the store gave up on (503, nothing executed). */
#define CLAIMED     1
#define MISMATCH    2
#define COMPLETED   3
#define IN_PROGRESS 4
#define UNKNOWN     5
#define STORE_ERROR 6

/* What the gateway does once the upstream answered (classify_status and proxy.cpp). */
#define O_STORE   1  /* 2xx/3xx/4xx: complete */
#define O_FAIL    2  /* 5xx: fail (failed_retryable) */
#define O_RELEASE 3  /* 408/409/425/429, upstream unreachable, a claim answered after its 503 */
#define O_LEAVE   4  /* sent, answer lost or timed out: the record stays in progress */

#ifdef UNKNOWN_POLICY
#define TAKE_OVER false
#else
#define TAKE_OVER true
#endif

/* ---- the store's record (what every backend stores) ------------------------------------ */
byte r_state = ABSENT;
byte r_hash;        /* request_hash */
byte r_tok;         /* fencing_token */
bool r_lease_over;  /* lease_expires <= now */
bool r_expired;     /* expires <= now: the record is as if absent */
byte r_resp;        /* the stored response: the token of the execution that produced it */

/* ---- ghost state: what the properties talk about; no step of the protocol reads it ------- */
byte r_life;               /* which life of the key the record is in */
byte lives;                /* lives begun so far */
byte holder;               /* token of the claim the record reflects while in progress, else 0 */
byte next_tok = 1;
byte life_of[NTOK];        /* the life each token's claim joined */
bool lease_ran_out[NLIFE]; /* a holder's lease ran out in that life */
byte life_hash[NLIFE];     /* the request that began each life */
byte effects[NLIFE];       /* upstream effects caused by each life's holders */
byte first_resp[NLIFE];    /* the first response stored in each life */
bool w_refused_late;       /* witnesses: events the model must be able to reach */
bool w_second_effect;
bool w_replay;
bool w_mismatch;
bool w_unknown;
bool w_purged;
bool w_after_failure;

chan net = [NREQ_A + NREQ_B] of { byte };

/* Scratch of one indivisible step (d_step): never read across steps, so kept out of the state. */
hidden byte was_state, was_hash, was_tok, was_resp, l;
hidden byte applied;

/* A record's fields, when it goes away. */
inline clear_record() {
  r_state = ABSENT; r_hash = 0; r_tok = 0; r_lease_over = false; r_expired = false; r_resp = 0;
  holder = 0
}

/* decide_claim (core/src/store.cpp), on a record as read: same order, same rules. */
inline decide(st, hs, lo, ex, h, res) {
  if
  :: st == ABSENT || ex -> res = CLAIMED
  :: else ->
     if
     :: hs != h -> res = MISMATCH
     :: else ->
        if
        :: st == DONE -> res = COMPLETED
        :: st == FAILED -> res = CLAIMED
        :: st == INPROG && !lo -> res = IN_PROGRESS
        :: st == INPROG && lo && !TAKE_OVER -> res = UNKNOWN
        :: st == INPROG && lo && TAKE_OVER -> res = CLAIMED
        fi
     fi
  fi
}

/* claimed_record, written over whatever is there. The ghost life follows the record as it
 * really is at the write (not the claim's decision), so that a write over a live record stays
 * in that record's life. */
inline write_claim(h, t) {
  if
  :: r_state == ABSENT || r_expired -> lives++; r_life = lives; life_hash[r_life] = h
  :: else -> skip
  fi;
  r_state = INPROG; r_hash = h; r_tok = t; r_lease_over = false; r_expired = false; r_resp = 0;
  holder = t; life_of[t] = r_life
}

/* The answers that change nothing: the record must be as it was before the step. */
inline answer(res, h, was_state, was_hash, was_tok, was_resp) {
  assert(r_state == was_state && r_hash == was_hash && r_tok == was_tok && r_resp == was_resp);
  if
  :: res == COMPLETED ->
     /* the replay: the client gets the stored response, which is the life's first */
     assert(r_resp == first_resp[r_life]);
     w_replay = true
  :: res == MISMATCH -> w_mismatch = true
  :: res == UNKNOWN -> w_unknown = true
  :: else -> skip
  fi
}

/* One atomic step of the store: decide on the record as it is, write if claimed. */
inline claim_step(h, t, res) {
  was_state = r_state; was_hash = r_hash; was_tok = r_tok; was_resp = r_resp;
  decide(r_state, r_hash, r_lease_over, r_expired, h, res);
  if
  :: res == CLAIMED ->
     if :: r_state == FAILED && !r_expired -> w_after_failure = true :: else -> skip fi;
     write_claim(h, t)
  :: else -> answer(res, h, was_state, was_hash, was_tok, was_resp)
  fi
}

inline claim(h, t, res) {
#if defined(BUG_SPLIT_CLAIM)
  /* Seeded bug: read and decide in one step, write in another (no lock, no condition). */
  d_step { decide(r_state, r_hash, r_lease_over, r_expired, h, res) };
  d_step {
    if
    :: res == CLAIMED -> write_claim(h, t)
    :: else -> skip
    fi
  }
#elif defined(STORE_REDIS)
  /* RedisStore::claim: SET key <fresh record> NX GET (one command: writes only where no key is;
   * a record past its `expires` whose TTL has not run out is still a key), then, when the value
   * it got back is claimable by decide_claim, claim.lua decides again on the record as it is
   * then and writes: one script. */
  d_step {
    if
    :: r_state == ABSENT -> res = CLAIMED; write_claim(h, t); got_value = false
    :: else -> got_value = true;
       was_state = r_state; was_hash = r_hash; was_tok = r_tok; was_resp = r_resp;
       decide(r_state, r_hash, r_lease_over, r_expired, h, res);
       if
       :: res != CLAIMED -> answer(res, h, was_state, was_hash, was_tok, was_resp)
       :: else -> skip
       fi
    fi
  };
  if
  :: got_value && res == CLAIMED -> d_step { claim_step(h, t, res) }
  :: else -> skip
  fi
#elif defined(STORE_POSTGRES)
  /* idem_claim(): INSERT ... ON CONFLICT DO NOTHING; on conflict a plain SELECT (a fresh
   * snapshot) answers what changes nothing; a claimable row is read again FOR UPDATE and the
   * rule applied to that version under the row lock, with the takeover UPDATE. A row gone
   * between two statements sends it back to the INSERT; after two rounds (the function's eight)
   * it raises serialization_failure: a 503. */
  tries = 0;
  do
  :: tries == 2 -> res = STORE_ERROR; break
  :: else ->
     tries++;
     d_step {
       if
       :: r_state == ABSENT -> res = CLAIMED; write_claim(h, t); got_value = false
       :: else -> got_value = true
       fi
     };
     if
     :: !got_value -> break
     :: else -> skip
     fi;
     d_step {
       if
       :: r_state == ABSENT -> got_value = false
       :: else ->
          was_state = r_state; was_hash = r_hash; was_tok = r_tok; was_resp = r_resp;
          decide(r_state, r_hash, r_lease_over, r_expired, h, res);
          if
          :: res != CLAIMED -> answer(res, h, was_state, was_hash, was_tok, was_resp)
          :: else -> skip
          fi
       fi
     };
     if
     :: !got_value -> skip  /* deleted since the INSERT: insert again */
     :: got_value && res != CLAIMED -> break
     :: got_value && res == CLAIMED ->
        d_step {
          if
          :: r_state == ABSENT -> got_value = false
          :: else -> claim_step(h, t, res)
          fi
        };
        if
        :: got_value -> break
        :: else -> skip
        fi
     fi
  od
#else
  /* MemoryStore::claim under the shard mutex; SqliteStore's run_claim in a BEGIN IMMEDIATE
   * transaction (INSERT ON CONFLICT DO NOTHING, read, decide_claim, conditional UPDATE, all
   * under the database's write lock). */
  d_step { claim_step(h, t, res) }
#endif
}

/* The upstream performs the operation for the holder of token t. */
inline effect(h, t) {
  d_step {
    l = life_of[t];
    /* only the request that began the life ever executes in it */
    assert(life_hash[l] == h);
#ifdef UNKNOWN_POLICY
    /* at most one upstream effect per key while the record lives */
    assert(effects[l] == 0);
#else
    /* a second effect only after a holder's lease ran out in this life: a holder follows
     * another only by a takeover after its lease, or after its 5xx (which did nothing) */
    if
    :: effects[l] > 0 -> assert(lease_ran_out[l]); w_second_effect = true
    :: else -> skip
    fi;
#endif
    effects[l]++
  }
}

/* complete / fail / release, fenced: UPDATE ... WHERE fencing_token = ? AND state =
 * 'in_progress' (SQL), the token test of complete.lua / fail.lua / release.lua (Redis),
 * find_held (memory). */
inline finish(o, t) {
  d_step {
#ifdef BUG_NO_FENCE
    applied = r_state == INPROG && (o == O_STORE || r_tok == t);
#else
    applied = r_state == INPROG && r_tok == t;
#endif
    if
    :: applied ->
       /* no holder with a stale fence writes */
       assert(holder == t);
       if
       :: o == O_STORE ->
          /* the response stored in a life is never replaced */
          assert(first_resp[r_life] == 0);
          first_resp[r_life] = t;
          r_state = DONE; r_resp = t; r_expired = false; holder = 0
       :: o == O_FAIL -> r_state = FAILED; r_expired = false; holder = 0
       :: o == O_RELEASE -> clear_record()
       fi
    :: else ->
       /* refused: a takeover installed another token (or the record went away) */
       if :: r_state == INPROG && o == O_STORE -> w_refused_late = true :: else -> skip fi
    fi
  }
}

/* A gateway: engine + store client. It crashes at any step; what a crash leaves behind is one
 * of the paths below: before the claim, the request is lost (a copy nobody takes); after the
 * claim, the record stays in progress (LEAVE without the effect); after the upstream, before
 * the store heard of it, LEAVE with or without the effect. A restarted gateway serves the next
 * copy with nothing of the old request. */
proctype gateway() {
  byte h, t, res, o, tries;
  bool got_value;
end:
  do
  :: atomic { net ?? [A] -> net ?? A; h = A; t = next_tok; next_tok++ } -> goto serve
  :: atomic { net ?? [B] -> net ?? B; h = B; t = next_tok; next_tok++ } -> goto serve
  od;
serve:
  claim(h, t, res);
  if
  :: res == CLAIMED ->
     /* the upstream: the operation happens or not, and the answer says what to record */
     if
     :: effect(h, t); o = O_STORE  /* 2xx/3xx/4xx */
     :: o = O_FAIL                 /* 5xx: not done */
     :: o = O_RELEASE              /* not done: unreachable, 408/409/425/429, or a claim
                                      answered after its request got 503 (on_late) */
     :: effect(h, t); o = O_LEAVE  /* sent; timeout or crash after it took effect */
     :: o = O_LEAVE                /* crash after the claim, or a timeout before any effect */
     fi;
     if
     :: o != O_LEAVE -> finish(o, t)
     :: else -> skip
     fi
  :: else -> skip  /* 409, 422, 503, or the replay (checked in the claim) */
  fi;
  d_step {
    h = 0; t = 0; res = 0; o = 0; tries = 0; got_value = false
  };
  goto end
}

/* Time: a lease, then a retention, runs out at any moment (expires >= lease_expires: the engine
 * passes now + max(retention, lease)); writes that set them again reset them. */
proctype clock() {
end:
  do
  :: d_step { r_state == INPROG && !r_lease_over -> r_lease_over = true; lease_ran_out[r_life] = true }
  :: d_step { r_state != ABSENT && !r_expired && (r_state != INPROG || r_lease_over) -> r_expired = true }
  od
}

/* purge_expired: deletes a record past its expires (Redis: the key's TTL). */
proctype reaper() {
end:
  do
  :: d_step { r_state != ABSENT && r_expired -> clear_record(); w_purged = true }
  od
}

/* Every copy of each request is on the network from the start: a gateway takes one whenever it
 * likes, in any order, or never (lost), which covers every moment a client could retry at. */
init {
  byte n;
  atomic {
    n = NREQ_A;
    do :: n > 0 -> net ! A; n-- :: else -> break od;
    n = NREQ_B;
    do :: n > 0 -> net ! B; n-- :: else -> break od;
    run gateway();
    run gateway();
    run clock();
    run reaper()
  }
}

/* Reachability (-DWITNESS=n): each claims an event never happens; spin must refute it. */
#if WITNESS == 1
#define NEVER w_refused_late   /* a stale holder's late completion refused by the fence */
#elif WITNESS == 2
#define NEVER w_second_effect  /* a second effect after a takeover (reexecute) */
#elif WITNESS == 3
#define NEVER w_replay
#elif WITNESS == 4
#define NEVER w_mismatch
#elif WITNESS == 5
#define NEVER w_unknown        /* 409 outcome_unknown (unknown policy) */
#elif WITNESS == 6
#define NEVER w_purged
#elif WITNESS == 7
#define NEVER w_after_failure  /* a takeover of a failed_retryable record */
#endif
#if WITNESS > 0
active proctype witness() {
end:
  atomic { NEVER -> assert(false) }
}
#endif
