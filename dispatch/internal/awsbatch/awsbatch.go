// Package awsbatch is what the SQS and SNS sinks share: the mapping of an
// event to a message with attributes (at most ten, AWS's limit), FIFO
// message groups, and a sender that turns a dispatch.Batch into batch calls
// (SendMessageBatch, PublishBatch) of at most ten entries and 256 KiB each.
//
// What it promises: one aggregate has at most one event in flight. A batch
// goes out in rounds: round k holds the k-th event of every aggregate still
// going, so an aggregate's next event is sent only once the previous one was
// acknowledged, and an event that failed stops its aggregate (its later
// events stay NotAttempted, never sent). That is the only order a standard
// queue or topic can be given (it reorders what it holds); a FIFO one keeps
// it per message group. A call the service refuses as a whole for its
// content (one message too large, an attribute it does not take) is split
// into calls of one entry, so one bad event is dead-lettered alone. No call
// starts past the batch's trust deadline, and each is bounded by it.
//
// It imports nothing of outboxd but dispatch.
package awsbatch

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/aws/smithy-go"

	"github.com/outboxd/outboxd/dispatch"
)

// Limits of one SendMessageBatch or PublishBatch call.
const (
	MaxEntries = 10
	// MaxCallBytes is the most message bytes (bodies and attributes) per
	// call: SNS's limit, and SQS's before 2025 (now 1 MiB). A message above
	// it goes in a call of its own, and the service decides.
	MaxCallBytes = 256 * 1024
)

// DefaultTimeout bounds one call below the lease: a service that does not
// answer within it fails the call's events as retryable (the SDK's own
// retries of throttling and 5xx answers happen inside it).
const DefaultTimeout = 10 * time.Second

// Message is one entry of a batch call.
type Message struct {
	Body       string
	Attributes []dispatch.Header // at most MaxAttributes, all strings
	GroupID    string            // FIFO: MessageGroupId; "" otherwise
	DedupID    string            // FIFO: MessageDeduplicationId; "" otherwise
}

// Size is what the message counts towards a call's byte limit: the body and
// each attribute's name, data type and value.
func (m Message) Size() int {
	n := len(m.Body)
	for _, a := range m.Attributes {
		n += len(a.Key) + len("String") + len(a.Value)
	}
	return n
}

// Answer is the service's answer to one entry of a call.
type Answer struct {
	Ref         string // message id (and sequence number), when accepted
	Code        string // the error code; "" when accepted
	Message     string // the service's text for Code
	SenderFault bool
}

// Call sends msgs in one batch call. It returns one Answer per message,
// aligned by index, or an error when the call failed as a whole.
type Call func(ctx context.Context, msgs []Message) ([]Answer, error)

// Sender sends batches through one service's Call.
type Sender struct {
	// Service and Target name the destination in errors: "sqs", `queue "…"`.
	Service, Target string
	Call            Call
	// Permanent reports whether an error code of one message (an entry's,
	// or the whole call's when it held only that message) says that
	// retrying cannot succeed.
	Permanent func(code string) bool
	// Advice is what an operator does about a whole call's error code
	// ("create the queue"), or "".
	Advice func(code string) string
	// Timeout bounds each call; DefaultTimeout when 0.
	Timeout time.Duration
	// Log gets the batch's one warning about dropped attributes.
	Log *slog.Logger

	slots chan struct{} // one per call in flight, across Send calls
}

// NewSender returns s ready to send at most concurrency calls at once
// (dispatch.DefaultConcurrency when 0).
func NewSender(s Sender, concurrency int) *Sender {
	s.slots = make(chan struct{}, cmp.Or(concurrency, dispatch.DefaultConcurrency))
	if s.Log == nil {
		s.Log = slog.New(slog.DiscardHandler)
	}
	return &s
}

// Send delivers b; build maps each event to its message and the names of
// the row headers it left out (for one warning per batch). Safe for
// concurrent use.
func (s *Sender) Send(ctx context.Context, b dispatch.Batch, build func(dispatch.Event) (Message, []string)) []dispatch.Result {
	r := dispatch.NewRounds(b.Events)
	msgs := make([]Message, len(b.Events))
	var drops dispatch.DroppedHeaders
	for i, ev := range b.Events {
		var dropped []string
		msgs[i], dropped = build(ev)
		drops.Add(ev.ID, dropped)
	}
	drops.Log(s.Log, s.Service+": row headers dropped: their names collide with the contract's, or a message attribute cannot carry them (name, empty value, characters)")

	for {
		round := r.Next() // the next event of every aggregate whose previous one was delivered
		if len(round) == 0 {
			break
		}
		if !s.sendRound(ctx, b, msgs, round, r) {
			break // the deadline or ctx ended: the rest stay NotAttempted
		}
	}
	return r.Results()
}

// sendRound sends the events at idx (one per aggregate) in calls, at most
// len(s.slots) at once; it reports false if a call could not start because
// the deadline or ctx had ended.
func (s *Sender) sendRound(ctx context.Context, b dispatch.Batch, msgs []Message, idx []int, r *dispatch.Rounds) bool {
	var wg sync.WaitGroup
	var mu sync.Mutex // r, stopped
	stopped := false
	for _, call := range chunks(msgs, idx) {
		select {
		case s.slots <- struct{}{}:
		case <-ctx.Done():
			wg.Wait()
			return false
		}
		wg.Go(func() {
			defer func() { <-s.slots }()
			res, ok := s.send(ctx, b, msgs, call)
			mu.Lock()
			defer mu.Unlock()
			if !ok {
				stopped = true
			}
			for j, i := range call {
				if res[j].Outcome != dispatch.NotAttempted {
					r.Set(i, res[j])
					if b.Done != nil {
						b.Done(i, res[j])
					}
				}
			}
		})
	}
	wg.Wait()
	return !stopped
}

// send makes one call for the events at call, splitting it into calls of
// one when the service refuses it as a whole for a message's content. ok is
// false when a call could not start (deadline or ctx ended).
func (s *Sender) send(ctx context.Context, b dispatch.Batch, msgs []Message, call []int) (_ []dispatch.Result, ok bool) {
	res := make([]dispatch.Result, len(call))
	cctx, cancel, ok := b.Window(ctx)
	defer cancel()
	if !ok {
		return res, false
	}
	tctx, cancelT := context.WithTimeout(cctx, cmp.Or(s.Timeout, DefaultTimeout))
	defer cancelT()
	answers, err := s.callFor(tctx, msgs, call)
	if err == nil {
		for j, a := range answers {
			res[j] = s.entryResult(b.Events[call[j]].ID, a)
		}
		return res, true
	}
	code := errorCode(err)
	content := s.Permanent(code) && aboutMessages(err)
	if len(call) > 1 && cctx.Err() == nil && (content || code == codeBatchTooLong) {
		// Which message the service refused is not said: send each alone.
		return s.sendEach(ctx, b, msgs, call, res)
	}
	for j, i := range call {
		res[j] = s.callResult(b.Events[i].ID, len(call) == 1 && content, code, err, cctx, tctx)
	}
	return res, true
}

// callFor makes one call with the messages at call; an answer without one
// entry per message is an error.
func (s *Sender) callFor(ctx context.Context, msgs []Message, call []int) ([]Answer, error) {
	batch := make([]Message, len(call))
	for j, i := range call {
		batch[j] = msgs[i]
	}
	answers, err := s.Call(ctx, batch)
	if err == nil && len(answers) != len(call) {
		err = fmt.Errorf("%s: the service answered %d entries of %d", s.Service, len(answers), len(call))
	}
	return answers, err
}

// sendEach sends the events at call one per call, their results into res;
// ok is false when a call could not start (deadline or ctx ended).
func (s *Sender) sendEach(ctx context.Context, b dispatch.Batch, msgs []Message, call []int, res []dispatch.Result) (_ []dispatch.Result, ok bool) {
	for j, i := range call {
		r, ok := s.send(ctx, b, msgs, []int{i})
		if !ok {
			return res, false
		}
		res[j] = r[0]
	}
	return res, true
}

// codeBatchTooLong: the call's messages together are above the service's
// limit (a single message above it is too large itself).
const codeBatchTooLong = "BatchRequestTooLong"

// errorCode is the service's error code in err, without the
// "AWS.SimpleQueueService." prefix SQS puts on some; "" when the call got
// no answer from the service.
func errorCode(err error) string {
	var api smithy.APIError
	if !errors.As(err, &api) {
		return ""
	}
	code := api.ErrorCode()
	return code[strings.LastIndexByte(code, '.')+1:]
}

// entryResult is one accepted or refused entry of a call that went through.
func (s *Sender) entryResult(id int64, a Answer) dispatch.Result {
	if a.Code == "" {
		return dispatch.Result{Outcome: dispatch.Delivered, Ref: a.Ref}
	}
	err := fmt.Errorf("%s: %s: event %d refused: %s: %s", s.Service, s.Target, id, a.Code, dispatch.Clip(a.Message, 300))
	if s.Permanent(a.Code) {
		return dispatch.Failed(&dispatch.Error{Permanent: true, Err: fmt.Errorf("%w (retrying cannot help: fix the row, then replay it)", err)})
	}
	return dispatch.Failed(&dispatch.Error{Err: fmt.Errorf("%w; the event is retried", err)})
}

// aboutMessages: a whole call's error names the messages (their size,
// body or attributes), not the call's target or credentials, which an
// invalid-parameter code can also be about ("Invalid parameter: TopicArn").
// Only then is one message's refusal its own fault.
func aboutMessages(err error) bool {
	var api smithy.APIError
	return errors.As(err, &api) && strings.Contains(strings.ToLower(api.ErrorMessage()+" "+api.ErrorCode()), "message") ||
		errorCode(err) == codeBatchTooLong
}

// callResult is an event's result when its whole call failed; own says
// the call held only this message and the error is about it.
func (s *Sender) callResult(id int64, own bool, code string, err error, cctx, tctx context.Context) dispatch.Result {
	switch {
	case code == "" && cctx.Err() != nil:
		r := dispatch.Failed(fmt.Errorf("%s: %s: event %d: no answer before the lease's trust deadline or shutdown (%w): %w", s.Service, s.Target, id, context.Cause(cctx), err))
		r.Cut = true
		return r
	case code == "" && tctx.Err() != nil:
		return dispatch.Failed(fmt.Errorf("%s: %s: event %d: no answer within %s (is the endpoint reachable?); the event is retried: %w",
			s.Service, s.Target, id, cmp.Or(s.Timeout, DefaultTimeout), err))
	case code == "":
		return dispatch.Failed(fmt.Errorf("%s: %s: event %d: the call failed (is the endpoint reachable?); the event is retried: %w", s.Service, s.Target, id, err))
	case own:
		return dispatch.Failed(&dispatch.Error{Permanent: true, Err: fmt.Errorf("%s: %s: event %d refused (retrying cannot help: fix the row, then replay it): %w", s.Service, s.Target, id, err)})
	}
	advice := "the event is retried"
	if a := s.Advice(code); a != "" {
		advice = a + "; the event is retried"
	}
	return dispatch.Failed(fmt.Errorf("%s: %s: event %d: %s: %w", s.Service, s.Target, id, advice, err))
}

// chunks cuts idx into calls of at most MaxEntries messages and
// MaxCallBytes; a message above MaxCallBytes gets a call of its own.
func chunks(msgs []Message, idx []int) [][]int {
	var out [][]int
	var cur []int
	size := 0
	for _, i := range idx {
		n := msgs[i].Size()
		if len(cur) > 0 && (len(cur) == MaxEntries || size+n > MaxCallBytes) {
			out, cur, size = append(out, cur), nil, 0
		}
		cur, size = append(cur, i), size+n
	}
	if len(cur) > 0 {
		out = append(out, cur)
	}
	return out
}
