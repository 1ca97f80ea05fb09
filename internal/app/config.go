package app

import (
	"time"

	"github.com/outboxd/outboxd/config"
	"github.com/outboxd/outboxd/dispatch"
	"github.com/outboxd/outboxd/dispatch/kafka"
	"github.com/outboxd/outboxd/dispatch/nats"
	"github.com/outboxd/outboxd/dispatch/rabbitmq"
	"github.com/outboxd/outboxd/dispatch/redisstream"
	"github.com/outboxd/outboxd/poller"
	"github.com/outboxd/outboxd/reconcile"
)

// Defaults of the keys that configure the wiring itself (connections, HTTP,
// logs); every other key's default is the constant of the part it configures.
const (
	DefaultPostgresDSN = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
	DefaultRedisAddr   = "127.0.0.1:6379"
	DefaultWebhookURL  = "http://127.0.0.1:8081/events"
	DefaultHTTPAddr    = "127.0.0.1:9090"
)

// Defaults is every configuration key's default. Each value is written once:
// here for the wiring, as a Default* constant beside the Config of the part
// (poller, reconcile, dispatch) for the rest.
func Defaults() map[string]any {
	return map[string]any{
		"postgres.dsn":                            DefaultPostgresDSN,
		"postgres.dsn_file":                       "",
		"redis.addrs":                             []string{DefaultRedisAddr},
		"redis.mode":                              "single",
		"redis.username":                          "",
		"redis.password":                          "",
		"redis.db":                                0,
		"redis.key_prefix":                        "",
		"redis.master_name":                       "",
		"redis.password_file":                     "",
		"redis.tls.enabled":                       false,
		"redis.tls.ca_file":                       "",
		"redis.tls.cert_file":                     "",
		"redis.tls.key_file":                      "",
		"redis.tls.server_name":                   "",
		"redis.tls.insecure_skip_verify":          false,
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
		"dispatch.webhook.url":                    DefaultWebhookURL,
		"dispatch.webhook.secret":                 "",
		"dispatch.webhook.secret_file":            "",
		"dispatch.webhook.timeout":                dispatch.DefaultWebhookTimeout,
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
		"dispatch.cloudevents":                    false,
		"dispatch.cloudevents_source":             dispatch.DefaultCloudEventsSource,
		"http.addr":                               DefaultHTTPAddr,
		"http.pprof":                              false,
		"log.level":                               "info",
		"log.format":                              "json",
		"shutdown_timeout":                        poller.DefaultShutdownTimeout,
	}
}

// LoadConfig loads the configuration (file, environment, sets; see
// config.Load) with Defaults and checks it with Check. Every error that is
// the operator's to fix is a *config.KeyError naming the key (exit 2).
func LoadConfig(file string, sets []string) (*config.Config, error) {
	cfg, err := config.Load(file, sets, Defaults())
	if err != nil {
		return nil, err
	}
	if err := Check(cfg); err != nil {
		return nil, err
	}
	return cfg, nil
}

// Check asks each part to validate what only it understands (the
// reconciliation schedule, the webhook's URL and secret), so each rule has
// one home, and names the key of any error.
func Check(cfg *config.Config) error {
	if _, err := reconcile.ParseSchedule(cfg.Reconcile.Schedule); err != nil {
		return &config.KeyError{Key: "reconcile.schedule", Err: err}
	}
	d := cfg.Dispatch
	template := map[string]string{"kafka": "dispatch.kafka.topic", "nats": "dispatch.nats.subject",
		"rabbitmq": "dispatch.rabbitmq.routing_key", "redis_stream": "dispatch.redis_stream.stream"}[d.Sink]
	values := map[string]string{"dispatch.kafka.topic": d.Kafka.Topic, "dispatch.nats.subject": d.NATS.Subject,
		"dispatch.rabbitmq.routing_key": d.RabbitMQ.RoutingKey, "dispatch.redis_stream.stream": d.RedisStream.Stream}
	if template != "" {
		if _, err := dispatch.ParseTemplate(values[template]); err != nil {
			return &config.KeyError{Key: template, Err: err}
		}
	}
	if d.Sink == "kafka" {
		if _, err := kafka.ParseTopic(d.Kafka.Topic); err != nil {
			return &config.KeyError{Key: "dispatch.kafka.topic", Err: err}
		}
		if err := kafka.CheckBrokers(d.Kafka.Brokers); err != nil {
			return &config.KeyError{Key: "dispatch.kafka.brokers", Err: err}
		}
	}
	if d.Sink == "rabbitmq" {
		if _, err := rabbitmq.ParseURL(d.RabbitMQ.URL); err != nil {
			return &config.KeyError{Key: "dispatch.rabbitmq.url", Err: err}
		}
	}
	if d.Sink == "webhook" {
		if _, err := dispatch.ParseURL(d.Webhook.URL); err != nil {
			return &config.KeyError{Key: "dispatch.webhook.url", Err: err}
		}
		if _, err := dispatch.ParseSecret(d.Webhook.Secret); err != nil {
			return &config.KeyError{Key: cfg.SourceKey("dispatch.webhook.secret"), Err: err}
		}
	}
	return nil
}
