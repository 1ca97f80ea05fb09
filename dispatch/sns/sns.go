// Package sns is the Amazon SNS sink: PublishBatch calls of at most ten
// messages and 256 KiB, the payload as the message, the contract's headers
// as message attributes, and on a FIFO topic (its ARN ends in ".fifo")
// MessageGroupId = {aggregate_type}/{aggregate_id} and
// MessageDeduplicationId = the outbox id. Credentials and, unless set, the
// region (else the topic ARN's) come from the AWS SDK's default chain.
//
// What it promises: an event is Delivered only once SNS answered its entry
// as published. One aggregate has at most one message in flight (see
// dispatch/internal/awsbatch): on a FIFO topic its events reach FIFO
// subscriptions in id order per message group, and a retry within the
// five-minute deduplication window is dropped. What it does not: a standard
// topic keeps no order and may deliver twice; what a subscription does with
// a message (a filter policy, a failing endpoint, its own retries) is SNS's,
// not the relay's: "published" is all the relay can know.
//
// It imports nothing of outboxd but dispatch.
package sns

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/sns"
	"github.com/aws/aws-sdk-go-v2/service/sns/types"

	"github.com/outboxd/outboxd/dispatch"
	"github.com/outboxd/outboxd/dispatch/internal/awsbatch"
)

// DedupeWindow is how long a FIFO topic drops a repeated
// MessageDeduplicationId.
const DedupeWindow = 5 * time.Minute

// Config configures the sink.
type Config struct {
	TopicARN    string // arn:aws:sns:<region>:<account>:<name>
	Region      string // "": the SDK's chain, else the ARN's
	Endpoint    string // "": the SDK's; else the service address (emulators, VPC endpoints)
	CloudEvents dispatch.CloudEvents
	Concurrency int // calls at once; dispatch.DefaultConcurrency when 0
	Log         *slog.Logger
	// Timeout bounds each call; awsbatch.DefaultTimeout when 0.
	Timeout time.Duration
	// Options are added to the SDK's config loading (tests: static
	// credentials).
	Options []func(*config.LoadOptions) error
}

// Sink publishes batches to one SNS topic. Create with New.
type Sink struct {
	client *sns.Client
	topic  string
	fifo   bool
	ce     dispatch.CloudEvents
	sender *awsbatch.Sender

	idle *awsbatch.Idle // the client's connections: Close drops them
}

// ErrNoRegion: no region set, none in the SDK's chain, none in the ARN.
var ErrNoRegion = awsbatch.ErrNoRegion

// topicARN is arn:<partition>:sns:<region>:<account id>:<topic name>; a
// name is 1 to 256 of A-Z a-z 0-9 - _, FIFO names ending in ".fifo".
var topicARN = regexp.MustCompile(`^arn:aws[a-z-]*:sns:([a-z0-9-]*):([0-9]{12}):([A-Za-z0-9_-]{1,251}(?:\.fifo|[A-Za-z0-9_-]{0,5}))$`)

// ParseTopicARN checks a topic ARN. fifo says whether it names a FIFO
// topic; region is the ARN's.
func ParseTopicARN(s string) (fifo bool, region string, err error) {
	if s == "" {
		return false, "", errors.New("sns: empty topic ARN: set it to the topic's ARN (arn:aws:sns:<region>:<account>:<name>)")
	}
	m := topicARN.FindStringSubmatch(s)
	if m == nil {
		return false, "", fmt.Errorf("sns: topic ARN %q: want arn:aws:sns:<region>:<12-digit account>:<name> (1 to 256 of A-Z a-z 0-9 - _, FIFO names end in .fifo)", dispatch.Clip(s, 300))
	}
	return strings.HasSuffix(m[3], ".fifo"), m[1], nil
}

// New checks cfg and builds the client. It contacts nothing: a topic that
// is missing or unreachable makes sends fail, retryable, never New.
func New(ctx context.Context, cfg Config) (*Sink, error) {
	fifo, arnRegion, err := ParseTopicARN(cfg.TopicARN)
	if err != nil {
		return nil, err
	}
	if err := awsbatch.ParseEndpoint(cfg.Endpoint); err != nil {
		return nil, fmt.Errorf("sns: %w", err)
	}
	awsCfg, idle, err := awsbatch.LoadConfig(ctx, cfg.Region, arnRegion, cmp.Or(cfg.Concurrency, dispatch.DefaultConcurrency), cfg.Options...)
	if err != nil {
		return nil, fmt.Errorf("sns: %w", err)
	}
	client := sns.NewFromConfig(awsCfg, func(o *sns.Options) {
		if cfg.Endpoint != "" {
			o.BaseEndpoint = aws.String(cfg.Endpoint)
		}
	})
	s := &Sink{client: client, topic: cfg.TopicARN, fifo: fifo, ce: cfg.CloudEvents, idle: idle}
	s.sender = awsbatch.NewSender(awsbatch.Sender{Service: "sns", Target: fmt.Sprintf("topic %q", cfg.TopicARN),
		Call: s.call, Permanent: permanent, Advice: advice, Timeout: cfg.Timeout, Log: cfg.Log}, cfg.Concurrency)
	return s, nil
}

// Capabilities implements dispatch.Sink. MaxBatch 0: the sink cuts a
// batch into calls itself.
func (s *Sink) Capabilities() dispatch.Capabilities {
	if s.fifo {
		return dispatch.Capabilities{DedupeWindow: DedupeWindow,
			Ordering: "per message group {aggregate_type}/{aggregate_id} (FIFO topic; one message per aggregate in flight)"}
	}
	return dispatch.Capabilities{Ordering: "none kept by a standard topic: published in id order per aggregate, each after the previous was acknowledged"}
}

// Close drops the client's idle connections. Sends after it open new ones.
func (s *Sink) Close() error {
	s.idle.Close()
	return nil
}

// Send implements dispatch.Sink.
func (s *Sink) Send(ctx context.Context, b dispatch.Batch) []dispatch.Result {
	return s.sender.Send(ctx, b, func(ev dispatch.Event) (awsbatch.Message, []string) {
		return awsbatch.NewMessage(ev, b.Token, s.ce, s.fifo)
	})
}

// call is one PublishBatch.
func (s *Sink) call(ctx context.Context, msgs []awsbatch.Message) ([]awsbatch.Answer, error) {
	in := &sns.PublishBatchInput{TopicArn: aws.String(s.topic), PublishBatchRequestEntries: make([]types.PublishBatchRequestEntry, len(msgs))}
	for i, m := range msgs {
		e := types.PublishBatchRequestEntry{Id: awsbatch.EntryID(i), Message: aws.String(m.Body),
			MessageAttributes: make(map[string]types.MessageAttributeValue, len(m.Attributes))}
		for _, a := range m.Attributes {
			e.MessageAttributes[a.Key] = types.MessageAttributeValue{DataType: aws.String("String"), StringValue: aws.String(a.Value)}
		}
		if m.GroupID != "" {
			e.MessageGroupId, e.MessageDeduplicationId = aws.String(m.GroupID), aws.String(m.DedupID)
		}
		in.PublishBatchRequestEntries[i] = e
	}
	out, err := s.client.PublishBatch(ctx, in)
	if err != nil {
		return nil, err
	}
	answers := awsbatch.NewAnswers(len(msgs))
	for _, e := range out.Successful {
		ref := aws.ToString(e.MessageId)
		if e.SequenceNumber != nil {
			ref += "@" + *e.SequenceNumber
		}
		answers.Accepted(e.Id, ref)
	}
	for _, e := range out.Failed {
		answers.Refused(e.Id, e.Code, e.Message, e.SenderFault)
	}
	return answers.List(), nil
}

// permanentCodes are the error codes that say a message cannot be
// published as it is (too long, attributes refused), whatever the topic's
// state.
var permanentCodes = map[string]bool{
	"InvalidParameter":      true, // "Message too long", an invalid attribute
	"InvalidParameterValue": true,
	"ParameterValueInvalid": true,
	"BatchRequestTooLong":   true, // for a call of one message: the message itself
}

// permanent: retrying the message cannot succeed. Everything else
// (throttling, internal errors, KMS, a missing topic, access) is retried.
func permanent(code string) bool { return permanentCodes[code] }

// advice is what an operator does about a call's error code.
func advice(code string) string {
	switch code {
	case "NotFound":
		return "the topic does not exist: create it or fix dispatch.sns.topic_arn"
	case "AuthorizationError", "AccessDenied", "AccessDeniedException", "InvalidClientTokenId", "SignatureDoesNotMatch", "ExpiredToken":
		return "not allowed: check the credentials and grant sns:Publish on the topic"
	case "KMSAccessDenied", "KMSDisabled", "KMSNotFound", "KMSInvalidState", "KMSOptInRequired":
		return "the topic's KMS key refuses: check the key and its grants"
	case "Throttled", "ThrottlingException", "KMSThrottling":
		return "throttled by SNS"
	}
	return ""
}
