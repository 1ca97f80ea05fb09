package app

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"regexp"
	"slices"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/outboxd/outboxd/config"
	"github.com/outboxd/outboxd/dispatch"
	"github.com/outboxd/outboxd/dispatch/kafka"
	"github.com/outboxd/outboxd/dispatch/kinesis"
	"github.com/outboxd/outboxd/dispatch/nats"
	"github.com/outboxd/outboxd/dispatch/pubsub"
	"github.com/outboxd/outboxd/dispatch/rabbitmq"
	"github.com/outboxd/outboxd/dispatch/redisstream"
	"github.com/outboxd/outboxd/dispatch/sns"
	"github.com/outboxd/outboxd/dispatch/sqs"
	"github.com/outboxd/outboxd/dispatch/webhook"
	"github.com/outboxd/outboxd/internal/buildinfo"
	"github.com/outboxd/outboxd/internal/keys"
	"github.com/outboxd/outboxd/poller"
)

// destination is one sink with its settings: a name of the registry sinks
// and the section that configures it. "default" is configured by
// dispatch.sink and dispatch.<section>; the named destinations by
// dispatch.destinations.<name>.sink and .<section> (config.Destinations).
type destination struct {
	name   string          // "default", or the name under dispatch.destinations
	prefix string          // key prefix of its settings: "dispatch", "dispatch.destinations.<name>"
	d      config.Dispatch // its sink name and the sinks' sections
}

// key names one of the destination's settings, e.g. key("kafka.topic").
func (d destination) key(k string) string { return d.prefix + "." + k }

// destinations are the configured destinations, "default" first when
// there is one (config.Config.Destinations).
func destinations(cfg *config.Config) []destination {
	var out []destination
	for _, d := range cfg.Destinations() {
		out = append(out, destination{name: d.Name, prefix: d.Key, d: d.Dispatch})
	}
	return out
}

// sinkKind is everything the composition root knows of one kind of sink.
// Adding a sink touches the table sinks and the sink's own package, nothing
// else: config validation (Check), construction (App.Sink) and the start-up
// warnings (App.warnUnsafe) read it.
type sinkKind struct {
	// section is the key of its settings under the destination ("kafka").
	section string
	// templateKey is the setting (under section) holding the destination
	// template ("topic"), template reads it; "" when the sink has none.
	templateKey string
	template    func(config.Dispatch) string
	// check validates the settings without connecting; an error is a
	// *config.KeyError naming the key. May be nil.
	check func(cfg *config.Config, d destination) error
	// build constructs the sink (a broker that is down does not fail it).
	build func(a *App, d destination) (dispatch.Sink, error)
	// warn logs the start-up warnings of this kind of sink beside the shared
	// ones (the duplicate window, batch splitting). May be nil.
	warn func(a *App, d destination)
}

// sinks is the registry: dispatch.sink names one of its entries. What a
// sink can do at run time (ordering, duplicate window, batch limit) it
// reports itself (dispatch.Sink.Capabilities): the NATS sink learns its
// window from the server.
var sinks = map[string]sinkKind{
	"noop": {
		build: func(*App, destination) (dispatch.Sink, error) { return dispatch.Noop{}, nil },
	},
	"webhook": {
		section: "webhook",
		check:   checkWebhook,
		build: func(a *App, d destination) (dispatch.Sink, error) {
			w := d.d.Webhook
			headers, err := webhookHeaders(d)
			if err != nil {
				return nil, err
			}
			t, err := webhookTLS(d)
			if err != nil {
				return nil, err
			}
			return webhook.New(webhook.Config{URL: w.URL, Secret: w.Secret, Timeout: w.Timeout, Log: a.Log,
				Concurrency: a.Cfg.Poller.Concurrency, CloudEvents: cloudEvents(d),
				Headers: headers, SigningKey: w.SigningKey, TLS: t, UserAgent: "outboxd/" + buildinfo.Get().Version})
		},
	},
	"kafka": {
		section: "kafka", templateKey: "topic", template: func(d config.Dispatch) string { return d.Kafka.Topic },
		check: checkKafka,
		build: func(a *App, d destination) (dispatch.Sink, error) {
			k := d.d.Kafka
			t, err := tlsConfig(d.key("kafka.tls"), k.TLS)
			if err != nil {
				return nil, err
			}
			return kafka.New(kafka.Config{Brokers: k.Brokers, Topic: k.Topic, ClientID: k.ClientID,
				Timeout: k.Timeout, MaxMessageBytes: k.MaxMessageBytes,
				SASL: kafka.SASL{Mechanism: k.SASL.Mechanism, Username: k.SASL.Username, Password: k.SASL.Password},
				TLS:  t, CloudEvents: cloudEvents(d), Log: a.Log})
		},
		warn: func(a *App, d destination) {
			if k := d.d.Kafka.Timeout; k > a.Cfg.Poller.LockTTL/2 {
				a.Log.Warn(d.key("kafka.timeout")+" is above half of poller.lock_ttl: a slow cluster cuts sends at the lease instead of failing them",
					"timeout", k.String(), "lock_ttl", a.Cfg.Poller.LockTTL.String())
			}
		},
	},
	"nats": {
		section: "nats", templateKey: "subject", template: func(d config.Dispatch) string { return d.NATS.Subject },
		check: func(_ *config.Config, d destination) error {
			if f := d.d.NATS.CredsFile; f != "" {
				// The NATS client reads it itself, at each connection.
				if err := config.CheckFile(d.key("nats.creds_file"), f, config.SecretFileLimit); err != nil {
					return err
				}
			}
			return nil
		},
		build: func(a *App, d destination) (dispatch.Sink, error) {
			n := d.d.NATS
			_, horizon := poller.RetryHorizon(a.pollerConfig())
			return nats.New(nats.Config{URL: n.URL, Subject: n.Subject, CredsFile: n.CredsFile, CloudEvents: cloudEvents(d), Log: a.Log,
				RetryHorizon: horizon})
		},
	},
	"rabbitmq": {
		section: "rabbitmq", templateKey: "routing_key", template: func(d config.Dispatch) string { return d.RabbitMQ.RoutingKey },
		check: func(_ *config.Config, d destination) error {
			if _, err := rabbitmq.ParseURL(d.d.RabbitMQ.URL); err != nil {
				return &config.KeyError{Key: d.key("rabbitmq.url"), Err: err}
			}
			return nil
		},
		build: func(a *App, d destination) (dispatch.Sink, error) {
			r := d.d.RabbitMQ
			return rabbitmq.New(rabbitmq.Config{URL: r.URL, Exchange: r.Exchange, RoutingKey: r.RoutingKey,
				CloudEvents: cloudEvents(d), Log: a.Log})
		},
	},
	"redis_stream": {
		section: "redis_stream", templateKey: "stream", template: func(d config.Dispatch) string { return d.RedisStream.Stream },
		check: func(cfg *config.Config, d destination) error {
			if n := d.d.RedisStream.MaxLen; n < 0 {
				return &config.KeyError{Key: d.key("redis_stream.maxlen"), Err: fmt.Errorf("must be 0 (no trimming) or positive, got %d", n)}
			}
			if d.d.RedisStream.Addr == "" && !cfg.UsesRedis() {
				return &config.KeyError{Key: d.key("redis_stream.addr"), Err: errors.New("must be set: with lock.backend and idempotency.store postgres there is no lock's Redis to default to")}
			}
			return nil
		},
		build: func(a *App, d destination) (dispatch.Sink, error) {
			r := d.d.RedisStream
			var client redis.UniversalClient
			if len(a.Nodes) > 0 {
				client = a.Nodes[0]
			}
			if r.Addr != "" {
				tlsCfg, err := redisTLS(a.Cfg.Redis.TLS)
				if err != nil {
					return nil, err
				}
				c := a.Cfg.Redis
				c.Mode, c.Addrs = "single", []string{r.Addr}
				client = RedisNodes(c, tlsCfg)[0]
				a.extra = append(a.extra, client)
			}
			return redisstream.New(redisstream.Config{Client: client, Stream: r.Stream, MaxLen: r.MaxLen,
				KeyPrefix: a.Cfg.Redis.KeyPrefix, Reserved: keys.New(a.Cfg.Redis.KeyPrefix).Reserved(),
				CloudEvents: cloudEvents(d), Log: a.Log})
		},
	},
	"pubsub": {
		section: "pubsub", templateKey: "topic", template: func(d config.Dispatch) string { return d.PubSub.Topic },
		check: func(_ *config.Config, d destination) error {
			p := d.d.PubSub
			if p.Project == "" {
				return &config.KeyError{Key: d.key("pubsub.project"), Err: errors.New("empty: name the Google Cloud project of the topics")}
			}
			if _, err := pubsub.ParseTopic(p.Topic); err != nil {
				return &config.KeyError{Key: d.key("pubsub.topic"), Err: err}
			}
			if err := pubsub.CheckEndpoint(p.Endpoint); err != nil {
				return &config.KeyError{Key: d.key("pubsub.endpoint"), Err: err}
			}
			return nil
		},
		build: func(a *App, d destination) (dispatch.Sink, error) {
			p := d.d.PubSub
			// Sets up the client (credentials, connections); not kept.
			return pubsub.New(context.Background(), pubsub.Config{Project: p.Project, Topic: p.Topic, Endpoint: p.Endpoint,
				CloudEvents: cloudEvents(d), Log: a.Log})
		},
	},
	"kinesis": {
		section: "kinesis", templateKey: "stream", template: func(d config.Dispatch) string { return d.Kinesis.Stream },
		check: func(_ *config.Config, d destination) error {
			k := d.d.Kinesis
			if _, err := kinesis.ParseStream(k.Stream); err != nil {
				return &config.KeyError{Key: d.key("kinesis.stream"), Err: err}
			}
			if err := kinesis.CheckEndpoint(k.Endpoint); err != nil {
				return &config.KeyError{Key: d.key("kinesis.endpoint"), Err: err}
			}
			return nil
		},
		build: func(a *App, d destination) (dispatch.Sink, error) {
			k := d.d.Kinesis
			// Reads the AWS configuration (environment, files); not kept.
			s, err := kinesis.New(context.Background(), kinesis.Config{Stream: k.Stream, Region: k.Region, Endpoint: k.Endpoint,
				CloudEvents: cloudEvents(d), Log: a.Log})
			if errors.Is(err, kinesis.ErrRegion) {
				err = &config.KeyError{Key: d.key("kinesis.region"), Err: err}
			}
			return s, err
		},
		warn: func(a *App, d destination) {
			if d.d.CloudEvents && d.d.CloudEventsMode == dispatch.CloudEventsStructured {
				a.Log.Warn(d.key("cloudevents_mode") + " structured on kinesis: each record is the CloudEvent alone; fencing_token and the rows' own headers (the trace context among them) are not carried (binary mode keeps them)")
			}
		},
	},
	"sqs": {
		section: "sqs",
		check: func(_ *config.Config, d destination) error {
			q := d.d.SQS
			if _, _, err := sqs.ParseQueueURL(q.QueueURL); err != nil {
				return &config.KeyError{Key: d.key("sqs.queue_url"), Err: err}
			}
			return checkAWS(d, "sqs", q.Region, q.Endpoint)
		},
		build: func(a *App, d destination) (dispatch.Sink, error) {
			q := d.d.SQS
			// Loading reads the environment and files only; credentials
			// are fetched per call, bounded by each send's context.
			s, err := sqs.New(context.Background(), sqs.Config{QueueURL: q.QueueURL, Region: q.Region, Endpoint: q.Endpoint,
				CloudEvents: cloudEvents(d), Concurrency: a.Cfg.Poller.Concurrency, Log: a.Log})
			if err != nil {
				return nil, awsRegionKey(d, "sqs", err)
			}
			return s, nil
		},
	},
	"sns": {
		section: "sns",
		check: func(_ *config.Config, d destination) error {
			n := d.d.SNS
			if _, _, err := sns.ParseTopicARN(n.TopicARN); err != nil {
				return &config.KeyError{Key: d.key("sns.topic_arn"), Err: err}
			}
			return checkAWS(d, "sns", n.Region, n.Endpoint)
		},
		build: func(a *App, d destination) (dispatch.Sink, error) {
			n := d.d.SNS
			s, err := sns.New(context.Background(), sns.Config{TopicARN: n.TopicARN, Region: n.Region, Endpoint: n.Endpoint,
				CloudEvents: cloudEvents(d), Concurrency: a.Cfg.Poller.Concurrency, Log: a.Log})
			if err != nil {
				return nil, awsRegionKey(d, "sns", err)
			}
			return s, nil
		},
	},
}

// awsRegion is an AWS region name as a key may set it (us-east-1,
// cn-north-1, us-gov-west-1, eu-isoe-west-1).
var awsRegion = regexp.MustCompile(`^[a-z]{2}(-[a-z]+)+-[0-9]+$`)

// checkAWS checks the region and endpoint keys of an AWS sink's section.
func checkAWS(d destination, section, region, endpoint string) error {
	if region != "" && !awsRegion.MatchString(region) {
		return &config.KeyError{Key: d.key(section + ".region"), Err: fmt.Errorf("%q is not an AWS region name (e.g. us-east-1)", region)}
	}
	if err := sqs.ParseEndpoint(endpoint); err != nil { // the same rule for sns
		return &config.KeyError{Key: d.key(section + ".endpoint"), Err: err}
	}
	return nil
}

// awsRegionKey names <section>.region in a constructor's error that says
// no region was found anywhere.
func awsRegionKey(d destination, section string, err error) error {
	if errors.Is(err, sqs.ErrNoRegion) {
		return &config.KeyError{Key: d.key(section + ".region"), Err: fmt.Errorf("%w: set it, or AWS_REGION, or a region in ~/.aws/config", err)}
	}
	return err
}

// sinkOf returns the registry entry of d, or a *config.KeyError naming
// <prefix>.sink.
func sinkOf(d destination) (sinkKind, error) {
	k, ok := sinks[d.d.Sink]
	if !ok {
		return sinkKind{}, &config.KeyError{Key: d.key("sink"), Err: fmt.Errorf("want one of %s, got %q",
			strings.Join(slices.Sorted(maps.Keys(sinks)), ", "), d.d.Sink)}
	}
	return k, nil
}

// checkDestination checks d's settings as its sink reads them: the
// destination template, then the sink's own check.
func checkDestination(cfg *config.Config, d destination) error {
	k, err := sinkOf(d)
	if err != nil {
		return err
	}
	if err := checkCloudEvents(d); err != nil {
		return err
	}
	if k.templateKey != "" {
		if err := checkTemplate(k.template(d.d), d.d.AllowRowPrefixedDestinations); err != nil {
			return &config.KeyError{Key: d.key(k.section + "." + k.templateKey), Err: err}
		}
	}
	if k.check != nil {
		return k.check(cfg, d)
	}
	return nil
}

func cloudEvents(d destination) dispatch.CloudEvents {
	return dispatch.CloudEvents{Enabled: d.d.CloudEvents, Source: d.d.CloudEventsSource, Mode: d.d.CloudEventsMode}
}

// checkCloudEvents: a known mode, and structured only with CloudEvents on
// (asking for it with them off would silently send plain JSON).
func checkCloudEvents(d destination) error {
	if err := dispatch.CheckCloudEventsMode(d.d.CloudEventsMode); err != nil {
		return &config.KeyError{Key: d.key("cloudevents_mode"), Err: err}
	}
	if d.d.CloudEventsMode == dispatch.CloudEventsStructured && !d.d.CloudEvents {
		return &config.KeyError{Key: d.key("cloudevents_mode"), Err: fmt.Errorf("%s, but %s is false", dispatch.CloudEventsStructured, d.key("cloudevents"))}
	}
	return nil
}

// checkWebhook: the URL and the secret as the sink parses them, and a
// timeout that fits the lease.
func checkWebhook(cfg *config.Config, d destination) error {
	w := d.d.Webhook
	if _, err := webhook.ParseURL(w.URL); err != nil {
		return &config.KeyError{Key: d.key("webhook.url"), Err: err}
	}
	if _, err := webhook.ParseSecrets(w.Secret); err != nil {
		return &config.KeyError{Key: cfg.SourceKey(d.key("webhook.secret")), Err: err}
	}
	if _, err := webhook.ParseSigningKey(w.SigningKey); err != nil {
		return &config.KeyError{Key: cfg.SourceKey(d.key("webhook.signing_key")), Err: err}
	}
	if _, err := webhookHeaders(d); err != nil {
		return err
	}
	if _, err := webhookTLS(d); err != nil {
		return err
	}
	// 0 (the default) follows the lease: config.WebhookTimeout.
	if w.Timeout < 0 {
		return &config.KeyError{Key: d.key("webhook.timeout"), Err: fmt.Errorf("must be positive, or 0 to follow poller.lock_ttl, got %s", w.Timeout)}
	}
	// The poller trusts its lease for about 0.9 x lock_ttl after the last
	// renewal, and renews every lock_ttl/3: a request longer than half the
	// TTL can be cut by the lease every time, and its row never delivered.
	if limit := cfg.Poller.LockTTL / 2; w.Timeout > limit {
		return &config.KeyError{Key: d.key("webhook.timeout"), Err: fmt.Errorf(
			"must be at most half of poller.lock_ttl (%s), got %s: the lease is trusted for about 0.9 x poller.lock_ttl after its last renewal (renewed every poller.lock_ttl/3), so a longer request can be cut every time; lower the timeout or raise poller.lock_ttl",
			limit, w.Timeout)}
	}
	return nil
}

// webhookHeaders are d's static webhook headers, canonical names to
// values: dispatch.webhook.headers and the lines of headers_file, each
// checked by the webhook's rule (webhook.CheckStaticHeader). An error
// names the key and never the value.
func webhookHeaders(d destination) (map[string]string, error) {
	w := d.d.Webhook
	out := map[string]string{}
	for _, name := range slices.Sorted(maps.Keys(w.Headers)) {
		if err := webhook.CheckStaticHeader(name, w.Headers[name]); err != nil {
			return nil, &config.KeyError{Key: d.key("webhook.headers." + name), Err: err}
		}
		out[http.CanonicalHeaderKey(name)] = w.Headers[name]
	}
	if len(out) > webhook.MaxStaticHeaders {
		return nil, &config.KeyError{Key: d.key("webhook.headers"), Err: fmt.Errorf("%d static headers, want at most %d", len(out), webhook.MaxStaticHeaders)}
	}
	if w.HeadersFile == "" {
		return out, nil
	}
	key := d.key("webhook.headers_file")
	b, err := config.ReadFile(key, w.HeadersFile, config.SecretFileLimit)
	if err != nil {
		return nil, err
	}
	lines, err := webhook.ParseHeaderLines(string(b))
	if err != nil {
		return nil, &config.KeyError{Key: key, Err: err}
	}
	if n := len(out) + len(lines); n > webhook.MaxStaticHeaders {
		return nil, &config.KeyError{Key: key, Err: fmt.Errorf("%d static headers with %s, want at most %d", n, d.key("webhook.headers"), webhook.MaxStaticHeaders)}
	}
	for name, v := range lines {
		if _, dup := out[name]; dup {
			return nil, &config.KeyError{Key: key, Err: fmt.Errorf("header %s is also set in %s", name, d.key("webhook.headers"))}
		}
		out[name] = v
	}
	return out, nil
}

// webhookTLS is d's TLS to an https receiver (dispatch.webhook.tls.*);
// nil when none of its files is set.
func webhookTLS(d destination) (*tls.Config, error) {
	w := d.d.Webhook
	if w.TLS == (config.WebhookTLS{}) {
		return nil, nil
	}
	prefix := d.key("webhook.tls")
	if u, err := webhook.ParseURL(w.URL); err == nil && u.Scheme != "https" {
		return nil, &config.KeyError{Key: prefix, Err: fmt.Errorf("set, but %s is not an https URL", d.key("webhook.url"))}
	}
	t := config.TLS{Enabled: true, CAFile: w.TLS.CAFile, CertFile: w.TLS.CertFile, KeyFile: w.TLS.KeyFile}
	if err := config.CheckTLSFiles(prefix, t); err != nil {
		return nil, err
	}
	return tlsConfig(prefix, t)
}

// checkKafka: the topic's literal parts, the brokers, SASL and TLS files,
// each by the rule the sink itself applies (kafka.ParseTopic, CheckBrokers,
// CheckSASL).
func checkKafka(_ *config.Config, d destination) error {
	k := d.d.Kafka
	if _, err := kafka.ParseTopic(k.Topic); err != nil {
		return &config.KeyError{Key: d.key("kafka.topic"), Err: err}
	}
	if err := kafka.CheckBrokers(k.Brokers); err != nil {
		return &config.KeyError{Key: d.key("kafka.brokers"), Err: err}
	}
	if err := kafka.CheckSASL(kafka.SASL{Mechanism: k.SASL.Mechanism, Username: k.SASL.Username}); err != nil {
		key := d.key("kafka.sasl.mechanism")
		if errors.Is(err, kafka.ErrSASLUsername) {
			key = d.key("kafka.sasl.username")
		}
		return &config.KeyError{Key: key, Err: err}
	}
	return config.CheckTLSFiles(d.key("kafka.tls"), k.TLS)
}

// checkTemplate parses a destination template and refuses one that starts
// with a placeholder unless dispatch.allow_row_prefixed_destinations: such a
// template lets a row choose the whole name (a NATS $JS.API subject, one of
// the relay's own Redis keys); rows are also checked one by one when sent
// (dispatch.Template.Render), whatever this says.
func checkTemplate(s string, allowRowPrefixed bool) error {
	t, err := dispatch.ParseTemplate(s)
	if err != nil {
		return err
	}
	if t.StartsWithPlaceholder() && !allowRowPrefixed {
		return fmt.Errorf("template %q starts with a placeholder, so a row's value would choose the destination's whole name: start it with a literal prefix (e.g. \"outbox.event.{aggregate_type}\"), or set dispatch.allow_row_prefixed_destinations: true", s)
	}
	return nil
}
