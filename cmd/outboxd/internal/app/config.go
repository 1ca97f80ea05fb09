package app

import (
	"fmt"
	"slices"
	"time"

	"github.com/outboxd/outboxd/config"
	"github.com/outboxd/outboxd/dispatch"
	"github.com/outboxd/outboxd/dispatch/kafka"
	"github.com/outboxd/outboxd/dispatch/kinesis"
	"github.com/outboxd/outboxd/dispatch/nats"
	"github.com/outboxd/outboxd/dispatch/pubsub"
	"github.com/outboxd/outboxd/dispatch/rabbitmq"
	"github.com/outboxd/outboxd/dispatch/redisstream"
	"github.com/outboxd/outboxd/dispatch/webhook"
	"github.com/outboxd/outboxd/lock/etcdlease"
	"github.com/outboxd/outboxd/poller"
	"github.com/outboxd/outboxd/reconcile"
)

// PartDefaults are the defaults of the parts' keys (poller, reconcile,
// dispatch and each sink): each the Default* constant beside the Config it
// fills, which the part also applies to a zero field itself. The wiring's
// keys default in config (config.Defaults).
func PartDefaults() map[string]any {
	return map[string]any{
		"lock.etcd.key_prefix":                    etcdlease.DefaultKeyPrefix,
		"poller.lock_ttl":                         poller.DefaultLockTTL,
		"poller.lock_wait":                        poller.DefaultLockWait,
		"poller.batch_size":                       poller.DefaultBatchSize,
		"poller.poll_interval":                    poller.DefaultPollInterval,
		"poller.max_attempts":                     poller.DefaultMaxAttempts,
		"poller.concurrency":                      dispatch.DefaultConcurrency, // aggregates a per-event sink sends at once
		"poller.claim_ttl":                        poller.DefaultClaimTTL,
		"poller.backoff_base":                     poller.DefaultBackoffBase,
		"poller.backoff_max":                      poller.DefaultBackoffMax,
		"poller.notify":                           false,
		"poller.max_payload_bytes":                poller.DefaultMaxPayloadBytes,
		"poller.batch_max_bytes":                  poller.DefaultBatchMaxBytes,
		"poller.gap_wait":                         poller.DefaultGapWait,
		"reconcile.schedule":                      reconcile.DefaultSchedule,
		"reconcile.lock_ttl":                      reconcile.DefaultLockTTL,
		"reconcile.retention":                     reconcile.DefaultRetention,
		"reconcile.dead_retention":                time.Duration(0), // keep dead rows
		"reconcile.batch_size":                    reconcile.DefaultBatchSize,
		"dispatch.sink":                           "webhook",
		"dispatch.webhook.secret":                 "",
		"dispatch.webhook.secret_file":            "",
		"dispatch.webhook.timeout":                time.Duration(0), // follows poller.lock_ttl (config.WebhookTimeout)
		"dispatch.webhook.headers":                map[string]string{},
		"dispatch.webhook.headers_file":           "",
		"dispatch.webhook.signing_key":            "",
		"dispatch.webhook.signing_key_file":       "",
		"dispatch.webhook.tls.ca_file":            "",
		"dispatch.webhook.tls.cert_file":          "",
		"dispatch.webhook.tls.key_file":           "",
		"dispatch.kafka.brokers":                  []string{},
		"dispatch.kafka.topic":                    kafka.DefaultTopic,
		"dispatch.kafka.client_id":                kafka.DefaultClientID,
		"dispatch.kafka.timeout":                  kafka.DefaultTimeout,
		"dispatch.kafka.max_message_bytes":        kafka.DefaultMaxMessageBytes,
		"dispatch.kafka.sasl.mechanism":           "",
		"dispatch.kafka.sasl.username":            "",
		"dispatch.kafka.sasl.password":            "",
		"dispatch.kafka.sasl.password_file":       "",
		"dispatch.kafka.tls.enabled":              false,
		"dispatch.kafka.tls.ca_file":              "",
		"dispatch.kafka.tls.cert_file":            "",
		"dispatch.kafka.tls.key_file":             "",
		"dispatch.kafka.tls.server_name":          "",
		"dispatch.kafka.tls.insecure_skip_verify": false,
		"dispatch.nats.url":                       nats.DefaultURL,
		"dispatch.nats.subject":                   nats.DefaultSubject,
		"dispatch.nats.creds_file":                "",
		"dispatch.rabbitmq.url":                   rabbitmq.DefaultURL,
		"dispatch.rabbitmq.exchange":              rabbitmq.DefaultExchange,
		"dispatch.rabbitmq.routing_key":           rabbitmq.DefaultRoutingKey,
		"dispatch.redis_stream.addr":              "",
		"dispatch.redis_stream.stream":            redisstream.DefaultStream,
		"dispatch.redis_stream.maxlen":            redisstream.DefaultMaxLen,
		"dispatch.destinations":                   map[string]any{}, // named destinations, each like dispatch (config.Destination)
		"dispatch.routes":                         []any{},
		"dispatch.pubsub.project":                 "",
		"dispatch.pubsub.topic":                   pubsub.DefaultTopic,
		"dispatch.pubsub.endpoint":                "",
		"dispatch.kinesis.stream":                 kinesis.DefaultStream,
		"dispatch.kinesis.region":                 "",
		"dispatch.kinesis.endpoint":               "",
		"dispatch.sqs.queue_url":                  "",
		"dispatch.sqs.region":                     "",
		"dispatch.sqs.endpoint":                   "",
		"dispatch.sns.topic_arn":                  "",
		"dispatch.sns.region":                     "",
		"dispatch.sns.endpoint":                   "",
		"dispatch.cloudevents":                    false,
		"dispatch.cloudevents_source":             dispatch.DefaultCloudEventsSource,
		"dispatch.cloudevents_mode":               dispatch.CloudEventsBinary,
		"dispatch.breaker.failures":               dispatch.DefaultBreakerFailures,
		"dispatch.breaker.probe_interval":         dispatch.DefaultBreakerProbeEvery,
		"shutdown_timeout":                        poller.DefaultShutdownTimeout,
		// A destination template may start with a placeholder only when set.
		"dispatch.allow_row_prefixed_destinations": false,
	}
}

// LoadConfig loads the configuration (file, environment, sets; see
// config.Load) with config.Defaults and checks the sections given (all when none
// is) with Check: a command passes the sections it uses. Every error that is
// the operator's to fix is a *config.KeyError naming the key (exit 2).
func LoadConfig(file string, sets []string, sections ...config.Section) (*config.Config, error) {
	cfg, err := config.Load(file, sets, config.Defaults(PartDefaults()), sections...)
	if err != nil {
		return nil, err
	}
	if err := Check(cfg, sections...); err != nil {
		return nil, err
	}
	// Shown as what it is in effect (outboxd config), not as "0".
	cfg.SetWebhookTimeouts(webhook.DefaultTimeout)
	return cfg, nil
}

// Check asks each part to validate what only it understands, for the
// sections given (all when none is), so each rule has one home, and names
// the key of any error: the reconciliation schedule (reconcile), and the
// destination's sink settings (the registry sinks, sinks.go).
func Check(cfg *config.Config, sections ...config.Section) error {
	if len(sections) == 0 || slices.Contains(sections, config.ReconcileSection) {
		if _, err := reconcile.ParseSchedule(cfg.Reconcile.Schedule); err != nil {
			return &config.KeyError{Key: "reconcile.schedule", Err: err}
		}
	}
	if len(sections) > 0 && !slices.Contains(sections, config.DispatchSection) {
		return nil
	}
	for _, d := range destinations(cfg) {
		if err := checkDestination(cfg, d); err != nil {
			return err
		}
	}
	_, err := routes(cfg)
	return err
}

// Routes are the configured destinations and dispatch.routes as a
// routing table without sinks (dispatch.Routes): which destination each
// event goes to, as the relay routes it. With one destination (no
// dispatch.destinations) every event goes to "default".
func Routes(cfg *config.Config) (*dispatch.Routes, error) {
	rs, err := routes(cfg)
	if err != nil {
		return nil, err
	}
	var names []string
	for _, d := range cfg.Destinations() {
		names = append(names, d.Name)
	}
	return dispatch.NewRoutes(names, rs)
}

// routes are dispatch.routes as the router takes them, each glob checked
// as the router parses it (dispatch.ParseGlob); an error names the key.
func routes(cfg *config.Config) ([]dispatch.Route, error) {
	var out []dispatch.Route
	for i, r := range cfg.Dispatch.Routes {
		for _, m := range []struct{ key, glob string }{{"aggregate_type", r.AggregateType}, {"event_type", r.EventType}} {
			if _, err := dispatch.ParseGlob(m.glob); err != nil {
				return nil, &config.KeyError{Key: fmt.Sprintf("dispatch.routes[%d].%s", i, m.key), Err: err}
			}
		}
		out = append(out, dispatch.Route{AggregateType: r.AggregateType, EventType: r.EventType, To: r.To})
	}
	return out, nil
}
