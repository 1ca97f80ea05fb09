// Package kinesis is the Amazon Kinesis Data Streams sink: aws-sdk-go-v2,
// PutRecords with a result per record, partition key = the aggregate. It
// imports nothing of outboxd but dispatch.
//
// Record format: Kinesis records have no headers, so each record's data is
// a JSON envelope {"headers":{...},"payload":...}: "headers" holds, as
// strings, exactly the headers every broker sink carries (id,
// aggregate_type, aggregate_id, event_type, created_at, fencing_token, the
// row's own headers, and the ce- CloudEvents attributes when enabled);
// "payload" is the row's payload JSON as is.
//
// CloudEvents has no Kinesis binding; outboxd's (Binding) is: binary mode
// is the envelope above with the attributes among its headers, as NATS'
// binding puts them in headers (ce- names, ce-datacontenttype); structured
// mode is the event alone in the JSON event format as the record's data
// (what a CloudEvents consumer of a header-less stream unmarshals), so the
// headers that are no CloudEvents attribute (fencing_token, the row's own,
// and with them the relay's trace context) are not carried.
//
// What it promises: an event is Delivered only once Kinesis answered its
// record with a sequence number; the events of one aggregate share a
// partition key ("<aggregate_type>/<aggregate_id>", dispatch.OrderingKey),
// so one shard, and are written in id order: PutRecords does not stop at a
// failed record, so one call carries at most one event per aggregate, and
// an aggregate's next event goes in a later call only once the earlier one
// was written. After an aggregate's first failure its later events are
// NotAttempted. What it does not: Kinesis does not dedupe, so an event
// resent after a timeout can land twice; consumers dedupe on the id header.
//
// The sink never creates streams: a missing one is a retryable failure
// naming it.
package kinesis

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/kinesis"
	"github.com/aws/aws-sdk-go-v2/service/kinesis/types"
	"github.com/aws/smithy-go"

	"github.com/outboxd/outboxd/dispatch"
)

// Defaults (docs/reference.md) for Config's zero fields.
const (
	DefaultStream = "outbox.event.{aggregate_type}"
	// DefaultTimeout bounds one Send below the lease: a stream that does
	// not answer within it fails the batch's unanswered events as
	// retryable.
	DefaultTimeout = 10 * time.Second
)

// Kinesis' limits (https://docs.aws.amazon.com/streams/latest/dev/service-sizes-and-limits.html).
const (
	maxRecords      = 500     // records per PutRecords
	maxCallBytes    = 5 << 20 // data and partition keys per PutRecords
	maxRecordBytes  = 1 << 20 // data and partition key of one record (the default maximum record size)
	maxPartitionKey = 256
)

// Binding is how a record carries a CloudEvent in binary mode: ce-
// attributes and ce-datacontenttype among the envelope's headers. In
// structured mode the record is the event (see the package doc).
var Binding = dispatch.Binding{Prefix: "ce-", FormatHeader: "content-type"}

// Config configures the sink.
type Config struct {
	Stream string // stream name template; DefaultStream when empty
	// Region is the AWS region; empty: the AWS default chain's (AWS_REGION,
	// the shared config file).
	Region string
	// Endpoint overrides the service URL (an emulator, a VPC endpoint);
	// empty: the region's Kinesis endpoint.
	Endpoint    string
	CloudEvents dispatch.CloudEvents // binary: ce- headers in the envelope; structured: the event as the record
	Log         *slog.Logger         // optional
	// Timeout bounds one Send (besides the batch's trust deadline);
	// DefaultTimeout when 0.
	Timeout time.Duration

	awsOpts []func(*awsconfig.LoadOptions) error // tests: static credentials
	http    aws.HTTPClient                       // tests: watch the calls
}

// Sink writes batches to Kinesis. Create with New.
type Sink struct {
	client  *kinesis.Client
	stream  dispatch.Template
	ce      dispatch.CloudEvents
	log     *slog.Logger
	timeout time.Duration
	mu      sync.Mutex // one Send at a time: batches reach each shard in order
}

// ErrRegion: no region is configured anywhere.
var ErrRegion = errors.New("kinesis: region: none set: set it, or AWS_REGION, or a region in the AWS config file")

// CheckConfig checks the stream template and the endpoint without
// connecting or reading credentials.
func CheckConfig(cfg Config) error {
	if _, err := ParseStream(cmp.Or(cfg.Stream, DefaultStream)); err != nil {
		return err
	}
	return CheckEndpoint(cfg.Endpoint)
}

// CheckEndpoint checks an endpoint override: empty, or http(s)://host[:port].
func CheckEndpoint(endpoint string) error {
	if endpoint == "" {
		return nil
	}
	u, err := url.Parse(endpoint)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil {
		return fmt.Errorf("kinesis: endpoint %q: want http(s)://host[:port]", endpoint)
	}
	return nil
}

// ParseStream reads a stream name template whose literal parts are valid
// in a stream name, so only a row's values can make an invalid one (that
// row is dead-lettered).
func ParseStream(s string) (dispatch.Template, error) {
	t, err := dispatch.ParseTemplate(s)
	if err != nil {
		return dispatch.Template{}, fmt.Errorf("kinesis: stream: %w", err)
	}
	if _, err := t.Render(dispatch.Event{AggregateType: "a", EventType: "e"}, dispatch.NameRules{Kind: dispatch.KinesisStream}); err != nil {
		return dispatch.Template{}, fmt.Errorf("kinesis: stream template %q: %w", s, err)
	}
	return t, nil
}

// New validates cfg, loads the AWS default configuration (credentials are
// resolved at the first send) and returns the sink. A region set nowhere
// is ErrRegion.
func New(ctx context.Context, cfg Config) (*Sink, error) {
	if err := CheckConfig(cfg); err != nil {
		return nil, err
	}
	stream, _ := ParseStream(cmp.Or(cfg.Stream, DefaultStream))
	opts := cfg.awsOpts
	if cfg.Region != "" {
		opts = append(opts, awsconfig.WithRegion(cfg.Region))
	}
	ac, err := awsconfig.LoadDefaultConfig(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("kinesis: AWS configuration: %w", err)
	}
	if ac.Region == "" {
		return nil, ErrRegion
	}
	client := kinesis.NewFromConfig(ac, func(o *kinesis.Options) {
		if cfg.Endpoint != "" {
			o.BaseEndpoint = aws.String(cfg.Endpoint)
		}
		if cfg.http != nil {
			o.HTTPClient = cfg.http
		}
	})
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Sink{client: client, stream: stream, ce: cfg.CloudEvents, log: log, timeout: cmp.Or(cfg.Timeout, DefaultTimeout)}, nil
}

// Capabilities implements dispatch.Sink.
func (s *Sink) Capabilities() dispatch.Capabilities {
	return dispatch.Capabilities{
		MaxBatch:     0, // split into PutRecords calls here
		DedupeWindow: 0,
		Ordering:     "per shard (partition key = aggregate_type/aggregate_id)",
	}
}

// record is one event ready to write.
type record struct {
	i      int // index in the batch
	stream string
	entry  types.PutRecordsRequestEntry
	size   int
}

// Send implements dispatch.Sink. It writes the batch in rounds: round k
// holds the k-th event of every aggregate still going, split into
// PutRecords calls per stream of at most 500 records and 5 MiB; an
// aggregate whose record failed takes no part in later rounds.
func (s *Sink) Send(ctx context.Context, b dispatch.Batch) []dispatch.Result {
	if len(b.Events) == 0 {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	start := time.Now()
	dctx, cancel, ok := b.Window(ctx)
	defer cancel()
	if !ok {
		return make([]dispatch.Result, len(b.Events))
	}
	tctx, cancelT := context.WithTimeout(dctx, s.timeout)
	defer cancelT()
	r := dispatch.NewRounds(b.Events)
	recs := s.records(b, r)
	calls := s.writeRounds(tctx, dctx, recs, r)
	out := r.Results()
	s.log.Debug("kinesis batch written", "batch_size", len(b.Events), "calls", calls, "duration_ms", time.Since(start).Milliseconds())
	return out
}

// records maps the batch's events to records, aligned with the batch; a
// refused event's result is set in r, which stops its aggregate there.
func (s *Sink) records(b dispatch.Batch, r *dispatch.Rounds) []record {
	recs := make([]record, len(b.Events))
	var drops dispatch.DroppedHeaders
	for i, ev := range b.Events {
		rec, dropped, err := s.record(i, ev, b.Token)
		drops.Add(ev.ID, dropped)
		if err != nil {
			r.Set(i, dispatch.Failed(err))
		}
		recs[i] = rec
	}
	drops.Log(s.log, "row headers dropped: their names collide with the contract's headers or they hold control characters")
	return recs
}

// writeRounds writes the records round by round (r.Next: the next event
// of every aggregate still going) until none is left or tctx ends, and
// reports the PutRecords calls made.
func (s *Sink) writeRounds(tctx, dctx context.Context, all []record, r *dispatch.Rounds) int {
	calls := 0
	for tctx.Err() == nil {
		round := r.Next()
		if len(round) == 0 {
			break
		}
		recs := make([]record, len(round))
		for j, i := range round {
			recs[j] = all[i]
		}
		slices.SortFunc(recs, func(x, y record) int { return cmp.Or(strings.Compare(x.stream, y.stream), x.i-y.i) })
		calls += s.writeRound(tctx, dctx, recs, r)
	}
	return calls
}

// writeRound writes one round's records in PutRecords calls per stream;
// an aggregate whose record is not delivered stops (r.Set). It reports the
// calls made; once tctx ends, the rest stay NotAttempted.
func (s *Sink) writeRound(tctx, dctx context.Context, recs []record, r *dispatch.Rounds) int {
	calls := 0
	for _, chunk := range chunks(recs) {
		if tctx.Err() != nil {
			break
		}
		calls++
		s.put(tctx, dctx, chunk, r)
	}
	return calls
}

// record maps event i to its Kinesis record (the envelope, or in
// structured mode the CloudEvent), or a Permanent error: a refused stream
// name, a record above the maximum size.
func (s *Sink) record(i int, ev dispatch.Event, token int64) (record, []string, error) {
	stream, err := s.stream.Render(ev, dispatch.NameRules{Kind: dispatch.KinesisStream})
	if err != nil {
		return record{i: i}, nil, fmt.Errorf("kinesis: %w: fix dispatch.kinesis.stream or the row's aggregate_type/event_type, then replay it", err)
	}
	m := dispatch.Encode(ev, token, s.ce, Binding)
	dropped := m.Dropped
	var data []byte
	if m.ContentType == dispatch.MediaTypeCloudEventsJSON {
		data, dropped = m.Body, nil // the event alone: no header is carried (see the package doc)
	} else {
		data, err = envelope(m.Headers, m.Body)
	}
	if err != nil {
		return record{i: i}, dropped, &dispatch.Error{Permanent: true, Err: fmt.Errorf("kinesis: event %d: encode the record: %w", ev.ID, err)}
	}
	key := dispatch.OrderingKey(ev, maxPartitionKey)
	size := len(data) + len(key)
	if size > maxRecordBytes {
		return record{i: i}, dropped, &dispatch.Error{Permanent: true, Err: fmt.Errorf(
			"kinesis: stream %q: event %d is a record of %d bytes (data and partition key); Kinesis accepts %d: shrink the payload, then replay it",
			stream, ev.ID, size, maxRecordBytes)}
	}
	return record{i: i, stream: stream, size: size,
		entry: types.PutRecordsRequestEntry{Data: data, PartitionKey: aws.String(key)}}, dropped, nil
}

// envelope is a record's data: {"headers":{...},"payload":<payload>}, the
// payload's bytes as they are (json.Marshal would re-encode them).
func envelope(hs []dispatch.Header, payload json.RawMessage) ([]byte, error) {
	m := make(map[string]string, len(hs))
	for _, h := range hs {
		m[h.Key] = h.Value
	}
	headers, err := json.Marshal(m)
	if err != nil {
		return nil, err
	}
	if len(payload) == 0 {
		payload = json.RawMessage("null")
	} else if !json.Valid(payload) {
		return nil, errors.New("the payload is not valid JSON")
	}
	data := make([]byte, 0, len(`{"headers":,"payload":}`)+len(headers)+len(payload))
	data = append(append(append(data, `{"headers":`...), headers...), `,"payload":`...)
	return append(append(data, payload...), '}'), nil
}

// chunks splits recs (sorted by stream) into PutRecords calls: one stream
// each, at most maxRecords records and maxCallBytes bytes.
func chunks(recs []record) [][]record {
	var out [][]record
	begin, bytes := 0, 0
	for i, r := range recs {
		if i > begin && (r.stream != recs[begin].stream || i-begin == maxRecords || bytes+r.size > maxCallBytes) {
			out = append(out, recs[begin:i])
			begin, bytes = i, 0
		}
		bytes += r.size
	}
	return append(out, recs[begin:])
}

// put writes one call's records and sets their results in r.
func (s *Sink) put(tctx, dctx context.Context, recs []record, r *dispatch.Rounds) {
	stream := recs[0].stream
	entries := make([]types.PutRecordsRequestEntry, len(recs))
	for j, r := range recs {
		entries[j] = r.entry
	}
	resp, err := s.client.PutRecords(tctx, &kinesis.PutRecordsInput{StreamName: aws.String(stream), Records: entries})
	if err == nil && len(resp.Records) != len(recs) {
		err = fmt.Errorf("the answer has %d results for %d records", len(resp.Records), len(recs))
	}
	if err != nil {
		res := s.callFailed(stream, err, dctx)
		for _, rec := range recs {
			r.Set(rec.i, res)
		}
		return
	}
	for j, res := range resp.Records {
		if res.ErrorCode == nil {
			r.Set(recs[j].i, dispatch.Result{Outcome: dispatch.Delivered,
				Ref: fmt.Sprintf("%s/%s@%s", stream, aws.ToString(res.ShardId), aws.ToString(res.SequenceNumber))})
			continue
		}
		r.Set(recs[j].i, dispatch.Failed(recordFailed(stream, aws.ToString(res.ErrorCode), aws.ToString(res.ErrorMessage))))
	}
}

// recordFailed says why Kinesis refused one record of a call. Every code
// Kinesis returns per record is worth retrying: throughput, internal
// failures, and the KMS key's state, which the operator can fix.
func recordFailed(stream, code, msg string) error {
	advice := "the event is retried"
	switch {
	case code == "ProvisionedThroughputExceededException":
		advice = "the shard's write throughput is exceeded (add shards or use on-demand mode); the event is retried"
	case strings.HasPrefix(code, "KMS"):
		advice = "the stream's KMS key refused the write: check the key's state and the credentials' kms:GenerateDataKey permission; the event is retried"
	}
	return fmt.Errorf("kinesis: stream %q: %s: %s: %s", stream, code, dispatch.Clip(msg, 300), advice)
}

// callFailed is the Result of every record of a call that failed whole.
func (s *Sink) callFailed(stream string, err error, dctx context.Context) dispatch.Result {
	var notFound *types.ResourceNotFoundException
	var denied *types.AccessDeniedException
	var api smithy.APIError
	switch {
	case dctx.Err() != nil:
		r := dispatch.Failed(fmt.Errorf("kinesis: stream %q: not answered before the lease's trust deadline or shutdown (%w): %w", stream, context.Cause(dctx), err))
		r.Cut = true
		return r
	case errors.As(err, &notFound):
		err = fmt.Errorf("kinesis: stream %q does not exist (or is not active): create it; the event is retried: %w", stream, err)
	case errors.As(err, &denied):
		err = fmt.Errorf("kinesis: stream %q: not allowed to write: grant the credentials kinesis:PutRecords on the stream; the event is retried: %w", stream, err)
	case errors.Is(err, context.DeadlineExceeded):
		err = fmt.Errorf("kinesis: stream %q: not answered within %s: the service is unreachable or slow; the event is retried: %w", stream, s.timeout, err)
	case errors.As(err, &api):
		err = fmt.Errorf("kinesis: stream %q: %s: %w; the event is retried", stream, api.ErrorCode(), err)
	default:
		err = fmt.Errorf("kinesis: stream %q: %w; the event is retried", stream, err)
	}
	return dispatch.Failed(err)
}
