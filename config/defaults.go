package config

import (
	"maps"
	"os"
	"time"
)

// Defaults of the keys that configure the wiring itself (connections,
// HTTP, logs, the demo's webhook receiver): config's own values.
const (
	DefaultPostgresDSN = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
	DefaultRedisAddr   = "127.0.0.1:6379"
	DefaultWebhookURL  = "http://127.0.0.1:8081/events"
	DefaultHTTPAddr    = "127.0.0.1:9090"
	// DefaultEtcdDialTimeout bounds the first connection to etcd.
	DefaultEtcdDialTimeout = 5 * time.Second
)

// Defaults is every configuration key's default: the wiring's, here, and
// parts, the keys of the parts (poller, reconcile, dispatch, the sinks).
// A part's default is the Default* constant beside its Config, which the
// part applies to a zero field itself (a sink built on its own gets it
// too); config imports nothing of outboxd, so the composition root hands
// them in, and each value is written once.
func Defaults(parts map[string]any) map[string]any {
	out := map[string]any{
		"postgres.dsn":                       DefaultPostgresDSN,
		"postgres.dsn_file":                  "",
		"postgres.schema":                    "public",
		"postgres.pooler":                    PoolerNone,
		"lock.backend":                       LockRedis,
		"lock.etcd.endpoints":                []string{},
		"lock.etcd.dial_timeout":             DefaultEtcdDialTimeout,
		"lock.etcd.username":                 "",
		"lock.etcd.password":                 "",
		"lock.etcd.password_file":            "",
		"lock.etcd.tls.enabled":              false,
		"lock.etcd.tls.ca_file":              "",
		"lock.etcd.tls.cert_file":            "",
		"lock.etcd.tls.key_file":             "",
		"lock.etcd.tls.server_name":          "",
		"lock.etcd.tls.insecure_skip_verify": false,
		"idempotency.store":                  "", // follows lock.backend (Idempotency)
		"redis.addrs":                        []string{DefaultRedisAddr},
		"redis.mode":                         "single",
		"redis.username":                     "",
		"redis.password":                     "",
		"redis.db":                           0,
		"redis.key_prefix":                   "",
		"redis.master_name":                  "",
		"redis.password_file":                "",
		"redis.tls.enabled":                  false,
		"redis.tls.ca_file":                  "",
		"redis.tls.cert_file":                "",
		"redis.tls.key_file":                 "",
		"redis.tls.server_name":              "",
		"redis.tls.insecure_skip_verify":     false,
		"dispatch.webhook.url":               DefaultWebhookURL,
		"http.addr":                          DefaultHTTPAddr,
		"http.pprof":                         false,
		"http.auth_token":                    "",
		"http.auth_token_file":               "",
		"http.auth_tokens_file":              "",
		"http.max_concurrent":                2,
		"log.level":                          "info",
		"log.format":                         "json",
		"instance_id":                        hostname(),
	}
	maps.Copy(out, parts)
	return out
}

// hostname is instance_id's default: the host name (in Kubernetes, the
// pod's name); "outboxd" when the system names none.
func hostname() string {
	h, err := os.Hostname()
	if err != nil || h == "" {
		return "outboxd"
	}
	return h
}
