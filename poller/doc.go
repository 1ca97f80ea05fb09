// Package poller is the active batch runner: it holds lock:outbox:poller,
// reads due rows, claims their idempotency keys, delivers them and writes the
// results back fenced.
//
// # Guarantees
//
//   - At most one runner acts at a time as far as Postgres is concerned: all
//     of its writes carry its fencing token, and a write from a runner whose
//     token has been superseded is refused (store.ErrStaleFence), after which
//     that runner steps down.
//   - No event is lost: a row is marked delivered only after its send
//     succeeded; a failed or abandoned send releases its claim (owner-checked)
//     so nothing blocks the retry; a crash at any point costs at most a
//     duplicate delivery, which receivers dedupe by id (Idempotency-Key).
//   - Per-aggregate order: rows of one (aggregate_type, aggregate_id) are sent
//     one after another in id order; the first failure stops that aggregate
//     for the batch, and later rows wait while an earlier one backs off.
//   - Work runs in the lock's context: when the lease is lost, no new send
//     starts.
//   - A crash costs about one lock TTL, never claim_ttl: a claim names the
//     token of the term that made it, and a holder with a higher token takes
//     it over at once (compare-and-set), since the older term's trust
//     deadline has passed by construction. After Redis lost the lock state,
//     the successor first waits one TTL (see lead; docs/design.md, "The
//     lease and the fence").
//   - A delivered mark names its row, not its id (keys.Judge): a mark left
//     by an earlier row with the same id is never taken for "delivered"
//     (docs/design.md, "Idempotency keys").
//   - Isolation: nothing about one row stalls the others. A row too large
//     or unsendable as it is (store.Row.Poison) is dead-lettered unloaded; an
//     idempotency key Redis cannot use (WRONGTYPE) or holding a value outboxd
//     did not write fails that row alone, counted and named in last_error;
//     any failure text is stored cleaned (package store). A row that keeps
//     failing dead-letters after MaxAttempts, no sooner than RetryHorizon.
//
// # Not guaranteed
//
// Exactly-once delivery is not guaranteed: a crash between send and mark
// resends. Order across aggregates is not guaranteed. Dead-lettered rows do
// not block their aggregate.
//
// # The read path
//
// The read path is where a term stands in the outbox. A fetch never walks
// what was settled before, and per-aggregate id order holds while producers
// race. Each mechanism is its own type in its own file:
//
//   - readCursor (cursor.go): the scan starts above it; it is saved, fenced,
//     for a successor to start from.
//   - gapWatch (gaps.go): rows above an id not yet visible wait while it may
//     still commit, at most gap_wait.
//   - parkedSet (parked.go): aggregates with pending rows at or below the
//     cursor, looked up by each read.
//   - lateCommits (late.go): late commits are delivered, warned and counted.
//     Its checks work within a term (sentMemory), across a change of holder
//     (inheritedCheck) and below the cursor (foundCheck).
//   - rescanPacer (rescan.go): the slow rescan below the cursor.
//   - coldPass (coldpass.go): the pass that finds what producers in flight
//     at a computed cursor left below it.
//   - epochWatch (rewind.go): ids reused at or below the cursor restart the
//     read state.
//
// Order is not guaranteed when an identity sequence caches values (CACHE >
// 1): ids are then not allocated in time order across sessions. The whole
// read path: docs/design.md, "The read path".
//
// # Floors
//
// The package's files sit on five floors. A file uses its own floor and the
// floors below it, never one above. Below the read path a floor is sealed:
// its files use only lower floors, so the mechanisms do not call each other.
// A mechanism's fields change only in its own file: a caller asks it (due,
// passing) and tells it (took, park), and never sets its state.
// layers_test.go checks both rules.
//
//  1. The runner: poller.go, run.go, batch.go, pipeline.go, claim.go,
//     deliver.go, finish.go, backoff.go, circuit.go, health.go, trace.go,
//     scripts.go, pgkeys.go. These are the methods of Poller and pipeline: the term,
//     the batch stages and the pipeline that sends and writes.
//  2. The read path: readpath.go. The reader ties the mechanisms together
//     for one term. It gets what it acts on (readDeps) from the runner.
//  3. Composed mechanisms: cursor.go (readCursor), late.go (lateCommits).
//  4. Mechanisms: gaps.go, parked.go, rescan.go, coldpass.go, rewind.go,
//     paused.go, quiet.go, latefound.go, lateinherited.go, sentmemory.go.
//  5. Values: item.go (a batch's rows and their outcomes), latecheck.go
//     (what the late-commit checks share).
package poller
