package awsbatch

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"

	"github.com/outboxd/outboxd/dispatch"
)

// DedupeWindow is how long a FIFO queue or topic drops a repeated
// MessageDeduplicationId.
const DedupeWindow = 5 * time.Minute

// Spec is what a service's sink tells NewSink.
type Spec struct {
	Service string // "sqs"
	Kind    string // "queue"
	Target  string // the queue URL, the topic ARN
	FIFO    bool
	// Region is the configured one; Fallback the destination's own (from
	// its URL or ARN), used when neither Region nor the SDK's chain has one.
	Region, Fallback string
	Endpoint         string // "": the SDK's
	CloudEvents      dispatch.CloudEvents
	Concurrency      int           // calls at once; dispatch.DefaultConcurrency when 0
	Timeout          time.Duration // per call; DefaultTimeout when 0
	Log              *slog.Logger
	Options          []func(*config.LoadOptions) error
	Permanent        func(code string) bool
	Advice           func(code string) string
}

// Sink is a batch sink of one AWS service: the service's package gives it
// the batch call.
type Sink struct {
	sender *Sender
	spec   Spec
	idle   *Idle
}

// NewSink loads the SDK's configuration and builds the sink around the
// call newCall makes with it (its client given the endpoint override).
func NewSink(ctx context.Context, spec Spec, newCall func(cfg aws.Config, endpoint *string) Call) (*Sink, error) {
	if err := ParseEndpoint(spec.Endpoint); err != nil {
		return nil, fmt.Errorf("%s: %w", spec.Service, err)
	}
	conns := spec.Concurrency
	if conns == 0 {
		conns = dispatch.DefaultConcurrency
	}
	cfg, idle, err := LoadConfig(ctx, spec.Region, spec.Fallback, conns, spec.Options...)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", spec.Service, err)
	}
	var endpoint *string
	if spec.Endpoint != "" {
		endpoint = aws.String(spec.Endpoint)
	}
	sender := NewSender(Sender{Service: spec.Service, Target: fmt.Sprintf("%s %q", spec.Kind, spec.Target),
		Call: newCall(cfg, endpoint), Permanent: spec.Permanent, Advice: spec.Advice, Timeout: spec.Timeout, Log: spec.Log}, spec.Concurrency)
	return &Sink{sender: sender, spec: spec, idle: idle}, nil
}

// Capabilities implements dispatch.Sink. MaxBatch 0: the sink cuts a
// batch into calls itself.
func (s *Sink) Capabilities() dispatch.Capabilities {
	if s.spec.FIFO {
		return dispatch.Capabilities{DedupeWindow: DedupeWindow,
			Ordering: "per message group {aggregate_type}/{aggregate_id} (FIFO " + s.spec.Kind + "; one message per aggregate in flight)"}
	}
	return dispatch.Capabilities{Ordering: "none kept by a standard " + s.spec.Kind + ": sent in id order per aggregate, each after the previous was acknowledged"}
}

// Send implements dispatch.Sink.
func (s *Sink) Send(ctx context.Context, b dispatch.Batch) []dispatch.Result {
	return s.sender.Send(ctx, b, func(ev dispatch.Event) (Message, []string) {
		return NewMessage(ev, b.Token, s.spec.CloudEvents, s.spec.FIFO)
	})
}

// Close drops the client's idle connections; sends after it open new ones.
func (s *Sink) Close() error {
	s.idle.Close()
	return nil
}

// AttributeMap is attrs as a service's map of String attributes.
func AttributeMap[T any](attrs []dispatch.Header, str func(value *string) T) map[string]T {
	out := make(map[string]T, len(attrs))
	for _, a := range attrs {
		out[a.Key] = str(aws.String(a.Value))
	}
	return out
}

// Ref is an accepted entry's reference: its message id, and "@" and its
// sequence number on a FIFO destination.
func Ref(messageID, sequence *string) string {
	if sequence == nil {
		return aws.ToString(messageID)
	}
	return aws.ToString(messageID) + "@" + *sequence
}
