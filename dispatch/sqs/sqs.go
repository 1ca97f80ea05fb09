// Package sqs is the Amazon SQS sink: SendMessageBatch calls of at most ten
// messages and 256 KiB, the payload as the body, the contract's headers as
// message attributes, and on a FIFO queue (its URL ends in ".fifo")
// MessageGroupId = {aggregate_type}/{aggregate_id} and
// MessageDeduplicationId = "<outbox id>:<fingerprint>" (Event.DedupeID). Credentials and, unless set, the
// region come from the AWS SDK's default chain (environment, shared config,
// web identity, container and instance roles); else the region is the one
// in the queue URL's host.
//
// What it promises: an event is Delivered only once SQS answered its entry
// as successful. One aggregate has at most one message in flight (see
// dispatch/internal/awsbatch): on a FIFO queue its events are in id order
// in their message group, and a retry within SQS's five-minute
// deduplication window is dropped by the queue, while a new row that
// reuses an id (a sequence rewind, a re-import) has another deduplication
// id and is never dropped. What it does not: a
// standard queue keeps no order and may deliver a message twice, so its
// consumers order by id per aggregate and dedupe on it; a FIFO retry after
// the window lands twice (consumers dedupe on the id attribute).
//
// It imports nothing of outboxd but dispatch.
package sqs

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"regexp"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/outboxd/outboxd/dispatch"
	"github.com/outboxd/outboxd/dispatch/internal/awsbatch"
)

// Config configures the sink.
type Config struct {
	QueueURL    string // https://sqs.<region>.amazonaws.com/<account>/<name>
	Region      string // "": the SDK's chain, else the one in QueueURL's host
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

// Sink sends batches to one SQS queue. Create with New; Close when done.
type Sink struct{ *awsbatch.Sink }

// ErrNoRegion: no region set, none in the SDK's chain, none in the queue
// URL's host.
var ErrNoRegion = awsbatch.ErrNoRegion

// queueName is an SQS queue name: 1 to 80 of A-Z a-z 0-9 - _, and ".fifo"
// at the end of a FIFO queue's.
var queueName = regexp.MustCompile(`^[A-Za-z0-9_-]{1,75}(\.fifo|[A-Za-z0-9_-]{0,5})$`)

// regionInHost finds the region in sqs.<region>.amazonaws.com (and .cn)
// and the legacy <region>.queue.amazonaws.com.
var regionInHost = regexp.MustCompile(`^(?:sqs\.([a-z0-9-]+)\.amazonaws\.com(?:\.cn)?|([a-z0-9-]+)\.queue\.amazonaws\.com(?:\.cn)?)$`)

// ParseQueueURL checks a queue URL: http or https, a host, no credentials,
// and the path /<account>/<queue name>. fifo says whether it names a FIFO
// queue; region is the one in an AWS host name, or "".
func ParseQueueURL(s string) (fifo bool, region string, err error) {
	if s == "" {
		return false, "", errors.New("sqs: empty queue URL: set it to the queue's URL (https://sqs.<region>.amazonaws.com/<account>/<name>)")
	}
	u, err := url.Parse(s)
	if err != nil {
		return false, "", errors.New("sqs: queue URL: not a URL") // url's error quotes it, credentials and all
	}
	if u.Scheme != "https" && u.Scheme != "http" || u.Host == "" || u.User != nil {
		return false, "", fmt.Errorf("sqs: queue URL %q: want https://host/<account>/<name> without credentials", dispatch.Clip(u.Redacted(), 200))
	}
	name := u.Path[strings.LastIndexByte(u.Path, '/')+1:]
	if !queueName.MatchString(name) || strings.Count(strings.Trim(u.Path, "/"), "/") != 1 {
		return false, "", fmt.Errorf("sqs: queue URL %q: the path must be /<account>/<queue name> (1 to 80 of A-Z a-z 0-9 - _, FIFO names end in .fifo)", dispatch.Clip(s, 200))
	}
	if m := regionInHost.FindStringSubmatch(u.Hostname()); m != nil {
		region = m[1] + m[2]
	}
	return strings.HasSuffix(name, ".fifo"), region, nil
}

// ParseEndpoint checks an endpoint override: "" or an http(s) URL.
func ParseEndpoint(s string) error { return awsbatch.ParseEndpoint(s) }

// New checks cfg and builds the client. It reads the SDK's configuration
// (environment, shared files) and contacts nothing: a queue that is missing
// or unreachable makes sends fail, retryable, never New.
func New(ctx context.Context, cfg Config) (*Sink, error) {
	fifo, urlRegion, err := ParseQueueURL(cfg.QueueURL)
	if err != nil {
		return nil, err
	}
	s, err := awsbatch.NewSink(ctx, awsbatch.Spec{Service: "sqs", Kind: "queue", Target: cfg.QueueURL, FIFO: fifo,
		Region: cfg.Region, Fallback: urlRegion, Endpoint: cfg.Endpoint, CloudEvents: cfg.CloudEvents, Concurrency: cfg.Concurrency,
		Timeout: cfg.Timeout, Log: cfg.Log, Options: cfg.Options, Permanent: permanent, Advice: advice},
		func(awsCfg aws.Config, endpoint *string) awsbatch.Call {
			client := sqs.NewFromConfig(awsCfg, func(o *sqs.Options) { o.BaseEndpoint = endpoint })
			return func(ctx context.Context, msgs []awsbatch.Message) ([]awsbatch.Answer, error) {
				return call(ctx, client, cfg.QueueURL, msgs)
			}
		})
	if err != nil {
		return nil, err
	}
	return &Sink{s}, nil
}

// call is one SendMessageBatch.
func call(ctx context.Context, client *sqs.Client, queue string, msgs []awsbatch.Message) ([]awsbatch.Answer, error) {
	in := &sqs.SendMessageBatchInput{QueueUrl: aws.String(queue), Entries: make([]types.SendMessageBatchRequestEntry, len(msgs))}
	for i, m := range msgs {
		in.Entries[i] = types.SendMessageBatchRequestEntry{Id: awsbatch.EntryID(i), MessageBody: aws.String(m.Body),
			MessageAttributes: awsbatch.AttributeMap(m.Attributes, func(v *string) types.MessageAttributeValue {
				return types.MessageAttributeValue{DataType: aws.String("String"), StringValue: v}
			})}
		if m.GroupID != "" {
			in.Entries[i].MessageGroupId, in.Entries[i].MessageDeduplicationId = aws.String(m.GroupID), aws.String(m.DedupID)
		}
	}
	out, err := client.SendMessageBatch(ctx, in)
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

// permanentCodes are the error codes that say a message cannot be sent as
// it is, whatever the queue's state: its body, size or attributes.
var permanentCodes = map[string]bool{
	"InvalidMessageContents":  true,
	"InvalidParameterValue":   true, // e.g. "Message must be shorter than 262144 bytes"
	"MessageTooLong":          true,
	"InvalidAttributeName":    true,
	"InvalidAttributeValue":   true,
	"BatchRequestTooLong":     true, // for a call of one message: the message itself
	"MessageAttributesTooBig": true,
}

// permanent: retrying the message cannot succeed. Everything else
// (throttling, internal errors, KMS, a missing queue, access) is retried.
func permanent(code string) bool { return permanentCodes[code] }

// advice is what an operator does about a call's error code.
func advice(code string) string {
	switch code {
	case "NonExistentQueue", "QueueDoesNotExist":
		return "the queue does not exist: create it or fix dispatch.sqs.queue_url"
	case "AccessDenied", "AccessDeniedException", "InvalidClientTokenId", "UnrecognizedClientException", "SignatureDoesNotMatch", "ExpiredToken":
		return "not allowed: check the credentials and grant sqs:SendMessage on the queue"
	case "KmsAccessDenied", "KmsDisabled", "KmsNotFound", "KmsInvalidState", "KmsInvalidKeyUsage":
		return "the queue's KMS key refuses: check the key and the grant of kms:GenerateDataKey and kms:Decrypt"
	case "RequestThrottled", "ThrottlingException", "KmsThrottled":
		return "throttled by SQS"
	}
	return ""
}
