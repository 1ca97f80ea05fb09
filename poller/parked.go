package poller

import "github.com/outboxd/outboxd/store"

// parkedSet holds the aggregates that may have pending rows at or below
// the cursor that neither the scan above the cursor nor the backoff index
// finds, each with its lowest such id: rows the scan passed while an
// earlier row of the aggregate backed off or was busy, rows a batch left
// undelivered, gaps found visible below the cursor, and what the rescan
// found. Every read looks them up from that id (store.ReadPos.Parked) and
// answers with their first rows (store.ReadResult.Parked); an aggregate
// with none left is dropped. The saved cursor stays below every one.
type parkedSet map[store.Aggregate]int64

// park notes that aggregate a has a pending row at or below the cursor
// from id on.
func (s parkedSet) park(a store.Aggregate, id int64) {
	if cur, ok := s[a]; !ok || id < cur {
		s[a] = id
	}
}

// answer applies a read's first row id of parked aggregate a: 0 drops it
// (gone), nothing of it is left pending at or below the cursor.
func (s parkedSet) answer(a store.Aggregate, id int64) (gone bool) {
	if id == 0 {
		delete(s, a)
		return true
	}
	s[a] = id
	return false
}

// from returns the id aggregate a is parked from, if parked.
func (s parkedSet) from(a store.Aggregate) (id int64, ok bool) {
	id, ok = s[a]
	return id, ok
}

// list is the set as a read takes it.
func (s parkedSet) list() []store.Parked {
	var out []store.Parked
	for a, id := range s {
		out = append(out, store.Parked{Aggregate: a, MinID: id})
	}
	return out
}

// lowest is the lowest parked id, or ok false when none is parked.
func (s parkedSet) lowest() (id int64, ok bool) {
	for _, x := range s {
		if !ok || x < id {
			id, ok = x, true
		}
	}
	return id, ok
}
