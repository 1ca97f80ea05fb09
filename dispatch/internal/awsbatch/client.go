package awsbatch

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"sync/atomic"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/config"

	"github.com/outboxd/outboxd/dispatch"
)

// ErrNoRegion: no region set, none in the SDK's chain, none in the
// destination's URL or ARN.
var ErrNoRegion = errors.New("no AWS region")

// LoadConfig reads the SDK's default configuration (environment, shared
// files; credentials are resolved per call, so nothing is contacted here)
// with region when set, else the chain's, else fallback (the destination's
// own, from its URL or ARN). Its HTTP client (the SDK's, so AWS_CA_BUNDLE
// still applies) keeps up to conns idle connections; Idle.Close drops
// them.
func LoadConfig(ctx context.Context, region, fallback string, conns int, opts ...func(*config.LoadOptions) error) (aws.Config, *Idle, error) {
	idle := &Idle{}
	client := awshttp.NewBuildableClient().WithTransportOptions(func(t *http.Transport) {
		t.MaxIdleConnsPerHost = max(conns, t.MaxIdleConnsPerHost)
		idle.tr.Store(t)
	})
	opts = append([]func(*config.LoadOptions) error{config.WithHTTPClient(client)}, opts...)
	if region != "" {
		opts = append(opts, config.WithRegion(region))
	}
	cfg, err := config.LoadDefaultConfig(ctx, opts...)
	if err != nil {
		return aws.Config{}, nil, fmt.Errorf("AWS configuration: %w", err)
	}
	if cfg.Region == "" {
		cfg.Region = fallback
	}
	if cfg.Region == "" {
		return aws.Config{}, nil, ErrNoRegion
	}
	return cfg, idle, nil
}

// Idle holds the transport the SDK's client built (on its first call).
type Idle struct {
	tr atomic.Pointer[http.Transport]
}

// Close drops the idle connections; later calls open new ones.
func (i *Idle) Close() {
	if t := i.tr.Load(); t != nil {
		t.CloseIdleConnections()
	}
}

// ParseEndpoint checks an endpoint override: "" or an http(s) URL.
func ParseEndpoint(s string) error {
	if s == "" {
		return nil
	}
	u, err := url.Parse(s)
	if err != nil || u.Scheme != "https" && u.Scheme != "http" || u.Host == "" || u.User != nil {
		return fmt.Errorf("endpoint %q: want an http or https URL without credentials, e.g. http://127.0.0.1:4566", dispatch.Clip(s, 200))
	}
	return nil
}

// EntryID is the batch entry id of a call's i-th message.
func EntryID(i int) *string { return aws.String(strconv.Itoa(i)) }

// Answers assembles a call's answers from the service's lists of accepted
// and refused entries (by EntryID).
type Answers struct {
	list []Answer
	got  []bool
}

// NewAnswers is for a call of n messages.
func NewAnswers(n int) *Answers { return &Answers{list: make([]Answer, n), got: make([]bool, n)} }

// Accepted records that entry id was taken, as ref.
func (x *Answers) Accepted(id *string, ref string) { x.set(id, Answer{Ref: ref}) }

// Refused records entry id's failure.
func (x *Answers) Refused(id, code, msg *string, senderFault bool) {
	x.set(id, Answer{Code: aws.ToString(code), Message: aws.ToString(msg), SenderFault: senderFault})
}

func (x *Answers) set(id *string, a Answer) {
	if i, err := strconv.Atoi(aws.ToString(id)); err == nil && i >= 0 && i < len(x.list) {
		x.list[i], x.got[i] = a, true
	}
}

// List is the answers by index; an entry the service did not mention is
// refused with code NoAnswer (retried).
func (x *Answers) List() []Answer {
	for i, ok := range x.got {
		if !ok {
			x.list[i] = Answer{Code: "NoAnswer", Message: "the service answered the call without this entry"}
		}
	}
	return x.list
}
