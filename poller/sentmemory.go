package poller

import (
	"cmp"

	"github.com/outboxd/outboxd/store"
)

// maxLastSent bounds the per-aggregate memory of the highest id sent.
const maxLastSent = 100_000

// sentMemory is what a term knows was sent: per aggregate the highest id
// sent this term, the highest id sent this term, and the sent mark the
// holders before it handed on. Every late-commit check asks it whether a
// later row of an aggregate went first, and the cursor save stores its
// mark. The per-aggregate memory is bounded: full, it is cleared and its
// generation moves on, so a check can tell "nothing sent" from
// "forgotten".
type sentMemory struct {
	last   map[store.Aggregate]int64 // highest id sent per aggregate, this term
	gen    int                       // bumped when last is cleared
	top    int64                     // highest id sent, this term
	handed int64                     // the sent mark loaded: the highest id the holders before handed on
	limit  int                       // bound on last (0: maxLastSent); tests lower it
}

// note records that id of aggregate a is sent (or on its way).
func (s *sentMemory) note(a store.Aggregate, id int64) {
	s.top = max(s.top, id)
	last, ok := s.last[a]
	if ok && last >= id {
		return
	}
	if !ok && len(s.last) >= cmp.Or(s.limit, maxLastSent) {
		clear(s.last)
		s.gen++
	}
	if s.last == nil {
		s.last = map[store.Aggregate]int64{}
	}
	s.last[a] = id
}

// mark is the sent mark a successor needs: no id above it was handed on to
// the sink by this holder or the ones before it.
func (s *sentMemory) mark() int64 { return max(s.handed, s.top) }

// handedOn sets the sent mark the holders before handed on (loaded with
// the cursor).
func (s *sentMemory) handedOn(mark int64) { s.handed = mark }

// handedMark is the sent mark the holders before handed on.
func (s *sentMemory) handedMark() int64 { return s.handed }

// generation is the memory's generation: it moves on each time the memory
// is cleared.
func (s *sentMemory) generation() int { return s.gen }

// laterSent says whether a row of aggregate a later than id went first,
// for a row whose gap was given up at generation gen: a later row is
// remembered (after: that row), or the memory forgot a since then (after:
// the highest id sent).
func (s *sentMemory) laterSent(a store.Aggregate, id int64, gen int) (after int64, late bool) {
	after, known := s.last[a]
	switch {
	case !known && gen == s.gen:
		return 0, false // nothing of its aggregate sent since it was given up
	case known && after < id:
		return 0, false
	case !known:
		after = s.top
	}
	return after, true
}
