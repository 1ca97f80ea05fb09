// Package sns is the Amazon SNS sink: PublishBatch calls of at most ten
// messages and 256 KiB, the payload as the message, the contract's headers
// as message attributes, and on a FIFO topic (its ARN ends in ".fifo")
// MessageGroupId = {aggregate_type}/{aggregate_id} and
// MessageDeduplicationId = "<outbox id>:<fingerprint>" (Event.DedupeID). Credentials and, unless set, the
// region come from the AWS SDK's default chain; else the region is the
// topic ARN's.
//
// What it promises: an event is Delivered only once SNS answered its entry
// as published. One aggregate has at most one message in flight (see
// dispatch/internal/awsbatch): on a FIFO topic its events reach FIFO
// subscriptions in id order per message group, and a retry within the
// five-minute deduplication window is dropped, while a new row that reuses
// an id (a sequence rewind, a re-import) has another deduplication id and
// is never dropped. What it does not: a standard
// topic keeps no order and may deliver twice; what a subscription does with
// a message (a filter policy, a failing endpoint, its own retries) is SNS's,
// not the relay's: "published" is all the relay can know.
//
// It imports nothing of outboxd but dispatch.
package sns

import (
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

// Sink publishes batches to one SNS topic. Create with New; Close when done.
type Sink struct{ *awsbatch.Sink }

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

// ParseEndpoint checks an endpoint override: "" or an http(s) URL.
func ParseEndpoint(s string) error { return awsbatch.ParseEndpoint(s) }

// New checks cfg and builds the client. It contacts nothing: a topic that
// is missing or unreachable makes sends fail, retryable, never New.
func New(ctx context.Context, cfg Config) (*Sink, error) {
	fifo, arnRegion, err := ParseTopicARN(cfg.TopicARN)
	if err != nil {
		return nil, err
	}
	s, err := awsbatch.NewSink(ctx, awsbatch.Spec{Service: "sns", Kind: "topic", Target: cfg.TopicARN, FIFO: fifo,
		Region: cfg.Region, Fallback: arnRegion, Endpoint: cfg.Endpoint, CloudEvents: cfg.CloudEvents, Concurrency: cfg.Concurrency,
		Timeout: cfg.Timeout, Log: cfg.Log, Options: cfg.Options, Permanent: permanent, Advice: advice},
		func(awsCfg aws.Config, endpoint *string) awsbatch.Call {
			client := sns.NewFromConfig(awsCfg, func(o *sns.Options) { o.BaseEndpoint = endpoint })
			return func(ctx context.Context, msgs []awsbatch.Message) ([]awsbatch.Answer, error) {
				return publish(ctx, client, cfg.TopicARN, msgs)
			}
		})
	if err != nil {
		return nil, err
	}
	return &Sink{s}, nil
}

// publish is one PublishBatch.
func publish(ctx context.Context, client *sns.Client, topic string, msgs []awsbatch.Message) ([]awsbatch.Answer, error) {
	in := &sns.PublishBatchInput{TopicArn: aws.String(topic), PublishBatchRequestEntries: make([]types.PublishBatchRequestEntry, len(msgs))}
	for i, m := range msgs {
		e := &in.PublishBatchRequestEntries[i]
		e.Id, e.Message = awsbatch.EntryID(i), aws.String(m.Body)
		e.MessageAttributes = awsbatch.AttributeMap(m.Attributes, func(v *string) types.MessageAttributeValue {
			return types.MessageAttributeValue{DataType: aws.String("String"), StringValue: v}
		})
		if m.GroupID != "" {
			e.MessageGroupId, e.MessageDeduplicationId = aws.String(m.GroupID), aws.String(m.DedupID)
		}
	}
	out, err := client.PublishBatch(ctx, in)
	if err != nil {
		return nil, err
	}
	answers := awsbatch.NewAnswers(len(msgs))
	for _, e := range out.Successful {
		answers.Accepted(e.Id, awsbatch.Ref(e.MessageId, e.SequenceNumber))
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
