// Package config loads outboxd's typed configuration: defaults, then a YAML
// file, then OUTBOXD_<SECTION>_<KEY> environment variables, then --set
// key=value flags. Decoding is strict (unknown keys are errors) and every
// error names the key at fault.
package config

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/go-viper/mapstructure/v2"
	"github.com/spf13/viper"
)

// Config is the whole configuration. Its mapstructure tags are the contract's
// key names.
type Config struct {
	Postgres        Postgres      `mapstructure:"postgres"`
	Redis           Redis         `mapstructure:"redis"`
	Poller          Poller        `mapstructure:"poller"`
	Reconcile       Reconcile     `mapstructure:"reconcile"`
	Dispatch        Dispatch      `mapstructure:"dispatch"`
	HTTP            HTTP          `mapstructure:"http"`
	Log             Log           `mapstructure:"log"`
	ShutdownTimeout time.Duration `mapstructure:"shutdown_timeout"`
}

type Postgres struct {
	DSN     string `mapstructure:"dsn"`
	DSNFile string `mapstructure:"dsn_file"` // read the DSN from this file (Kubernetes secret, systemd credential)
}

type Redis struct {
	Addrs        []string `mapstructure:"addrs"`
	Mode         string   `mapstructure:"mode"` // single | redlock | sentinel | cluster
	Username     string   `mapstructure:"username"`
	Password     string   `mapstructure:"password"`
	DB           int      `mapstructure:"db"`
	KeyPrefix    string   `mapstructure:"key_prefix"`
	PasswordFile string   `mapstructure:"password_file"`
	// MasterName is the Sentinel master name (mode sentinel).
	MasterName string `mapstructure:"master_name"`
	TLS        TLS    `mapstructure:"tls"`
}

// TLS is a client TLS setting (redis.tls, dispatch.kafka.tls).
type TLS struct {
	Enabled            bool   `mapstructure:"enabled"`
	CAFile             string `mapstructure:"ca_file"`
	CertFile           string `mapstructure:"cert_file"`
	KeyFile            string `mapstructure:"key_file"`
	ServerName         string `mapstructure:"server_name"`
	InsecureSkipVerify bool   `mapstructure:"insecure_skip_verify"`
}

type Poller struct {
	LockTTL      time.Duration `mapstructure:"lock_ttl"`
	LockWait     time.Duration `mapstructure:"lock_wait"`
	BatchSize    int           `mapstructure:"batch_size"`
	PollInterval time.Duration `mapstructure:"poll_interval"`
	MaxAttempts  int           `mapstructure:"max_attempts"`
	Concurrency  int           `mapstructure:"concurrency"`
	ClaimTTL     time.Duration `mapstructure:"claim_ttl"`
	BackoffBase  time.Duration `mapstructure:"backoff_base"`
	BackoffMax   time.Duration `mapstructure:"backoff_max"`
	Notify       bool          `mapstructure:"notify"`
	// MaxPayloadBytes: a row whose payload, headers and text columns
	// together exceed it is dead-lettered without being loaded.
	MaxPayloadBytes int `mapstructure:"max_payload_bytes"`
	// BatchMaxBytes is the byte budget of one batch (>= MaxPayloadBytes,
	// so the largest admissible row always fits).
	BatchMaxBytes int `mapstructure:"batch_max_bytes"`
	// GapWait bounds how long rows wait behind an earlier id whose producer
	// has not committed (per-aggregate order when producers race).
	GapWait time.Duration `mapstructure:"gap_wait"`
}

type Reconcile struct {
	Schedule      string        `mapstructure:"schedule"`
	LockTTL       time.Duration `mapstructure:"lock_ttl"`
	Retention     time.Duration `mapstructure:"retention"`
	DeadRetention time.Duration `mapstructure:"dead_retention"` // 0 keeps dead rows
	BatchSize     int           `mapstructure:"batch_size"`
}

type Dispatch struct {
	Sink              string      `mapstructure:"sink"` // webhook | kafka | nats | rabbitmq | redis_stream | noop
	Webhook           Webhook     `mapstructure:"webhook"`
	Kafka             Kafka       `mapstructure:"kafka"`
	NATS              NATS        `mapstructure:"nats"`
	RabbitMQ          RabbitMQ    `mapstructure:"rabbitmq"`
	RedisStream       RedisStream `mapstructure:"redis_stream"`
	CloudEvents       bool        `mapstructure:"cloudevents"`        // binary-mode CloudEvents attributes on every message
	CloudEventsSource string      `mapstructure:"cloudevents_source"` // their "source"
}

type Kafka struct {
	Brokers         []string      `mapstructure:"brokers"`
	Topic           string        `mapstructure:"topic"` // template: {aggregate_type}, {event_type}
	ClientID        string        `mapstructure:"client_id"`
	Timeout         time.Duration `mapstructure:"timeout"`           // bounds one produce, below the lease
	MaxMessageBytes int           `mapstructure:"max_message_bytes"` // the producer's record batch limit
	SASL            KafkaSASL     `mapstructure:"sasl"`
	TLS             TLS           `mapstructure:"tls"`
}

type KafkaSASL struct {
	Mechanism    string `mapstructure:"mechanism"` // "" (none), PLAIN, SCRAM-SHA-256, SCRAM-SHA-512
	Username     string `mapstructure:"username"`
	Password     string `mapstructure:"password"`
	PasswordFile string `mapstructure:"password_file"`
}

type NATS struct {
	URL       string `mapstructure:"url"`
	Subject   string `mapstructure:"subject"` // template
	CredsFile string `mapstructure:"creds_file"`
}

type RabbitMQ struct {
	URL        string `mapstructure:"url"`
	Exchange   string `mapstructure:"exchange"`
	RoutingKey string `mapstructure:"routing_key"` // template
}

type RedisStream struct {
	Addr   string `mapstructure:"addr"`   // "" = the lock's Redis
	Stream string `mapstructure:"stream"` // template
	MaxLen int64  `mapstructure:"maxlen"` // approximate trimming; 0 = none
}

type Webhook struct {
	URL        string        `mapstructure:"url"`
	Secret     string        `mapstructure:"secret"`
	SecretFile string        `mapstructure:"secret_file"`
	Timeout    time.Duration `mapstructure:"timeout"`
}

type HTTP struct {
	Addr  string `mapstructure:"addr"`
	Pprof bool   `mapstructure:"pprof"` // serve /debug/pprof/ on http.addr (profiling; off by default)
}

type Log struct {
	Level  string `mapstructure:"level"`
	Format string `mapstructure:"format"`
}

// Byte limits accepted for poller.max_payload_bytes.
const (
	minMaxPayloadBytes = 1 << 10 // 1 KiB
	maxMaxPayloadBytes = 256 << 20
)

// fields is every key of Config with its field's zero value (its type).
var fields = func() map[string]any {
	out := map[string]any{}
	walk(reflect.ValueOf(Config{}), "", out)
	return out
}()

// Keys lists every configuration key.
func Keys() []string {
	return slices.Sorted(maps.Keys(fields))
}

// Secret keys are replaced whole wherever the config is shown; postgres.dsn
// and dispatch.webhook.url are shown with their secrets parsed out
// (RedactDSN, RedactURL). *_file keys are paths and are shown.
var secretKeys = []string{"redis.password", "dispatch.webhook.secret", "dispatch.kafka.sasl.password"}

// KeyError is a configuration error about one key.
type KeyError struct {
	Key string
	Err error
}

func (e *KeyError) Error() string { return fmt.Sprintf("config: %s: %v", e.Key, e.Err) }
func (e *KeyError) Unwrap() error { return e.Err }

// Load reads file (optional: "" skips it), then the environment, then sets
// ("key=value"), and validates the result. defaults must give every key's
// default value: the components own them (see app.Defaults), and viper sees
// an environment-only value only for a key that has a default.
func Load(file string, sets []string, defaults map[string]any) (*Config, error) {
	v := viper.New()
	for _, k := range Keys() {
		d, ok := defaults[k]
		if !ok {
			return nil, fmt.Errorf("config: no default given for %s", k)
		}
		v.SetDefault(k, d)
	}
	if file != "" {
		v.SetConfigFile(file)
		v.SetConfigType("yaml")
		if err := v.ReadInConfig(); err != nil {
			return nil, &KeyError{Key: "--config", Err: fmt.Errorf("read %s: %w", file, err)}
		}
	}
	v.SetEnvPrefix("OUTBOXD")
	v.SetEnvKeyReplacer(strings.NewReplacer(".", "_"))
	v.AutomaticEnv()
	for _, s := range sets {
		k, val, ok := strings.Cut(s, "=")
		if !ok {
			return nil, &KeyError{Key: "--set", Err: fmt.Errorf("%q is not key=value", s)}
		}
		k = strings.ToLower(strings.TrimSpace(k))
		if _, known := fields[k]; !known {
			return nil, &KeyError{Key: k, Err: errors.New("unknown key")}
		}
		v.Set(k, val)
	}
	if err := checkUnknown(v); err != nil {
		return nil, err
	}
	// Decode key by key so a bad value is reported with its own key name.
	for k := range fields {
		if err := checkType(k, v.Get(k)); err != nil {
			return nil, err
		}
	}
	var c Config
	err := v.UnmarshalExact(&c, viper.DecodeHook(mapstructure.ComposeDecodeHookFunc(
		mapstructure.StringToTimeDurationHookFunc(),
		mapstructure.StringToSliceHookFunc(","),
	)))
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	for i, a := range c.Redis.Addrs {
		c.Redis.Addrs[i] = strings.TrimSpace(a)
	}
	if err := c.readSecretFiles(); err != nil {
		return nil, err
	}
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return &c, nil
}

// checkUnknown rejects keys in the file that outboxd does not know, naming them.
func checkUnknown(v *viper.Viper) error {
	for _, k := range v.AllKeys() {
		if _, ok := fields[k]; !ok {
			return &KeyError{Key: k, Err: errors.New("unknown key")}
		}
	}
	return nil
}

func checkType(key string, val any) error {
	s, isString := val.(string)
	if durationKeys[key] {
		switch {
		case isString:
			if _, err := time.ParseDuration(strings.TrimSpace(s)); err != nil {
				return &KeyError{Key: key, Err: fmt.Errorf("invalid duration %q (use e.g. 500ms, 30s, 5m, 168h)", s)}
			}
		default:
			if _, ok := val.(time.Duration); !ok {
				return &KeyError{Key: key, Err: fmt.Errorf("want a duration such as \"30s\", got %v", val)}
			}
		}
		return nil
	}
	if !isString {
		return nil
	}
	switch fields[key].(type) {
	case int:
		if _, err := strconv.Atoi(strings.TrimSpace(s)); err != nil {
			return &KeyError{Key: key, Err: fmt.Errorf("want an integer, got %q", s)}
		}
	case bool:
		if _, err := strconv.ParseBool(strings.TrimSpace(s)); err != nil {
			return &KeyError{Key: key, Err: fmt.Errorf("want true or false, got %q", s)}
		}
	}
	return nil
}

// durationKeys are the keys whose field is a time.Duration.
var durationKeys = func() map[string]bool {
	out := map[string]bool{}
	for k, v := range fields {
		if _, ok := v.(time.Duration); ok {
			out[k] = true
		}
	}
	return out
}()

// readSecretFiles fills secrets from their *_file keys. A file wins over the
// DSN's default; a password or secret set both ways is an error.
func (c *Config) readSecretFiles() error {
	for _, f := range []struct {
		key, file string
		dst       *string
		exclusive bool
	}{
		{"postgres.dsn_file", c.Postgres.DSNFile, &c.Postgres.DSN, false},
		{"redis.password_file", c.Redis.PasswordFile, &c.Redis.Password, true},
		{"dispatch.webhook.secret_file", c.Dispatch.Webhook.SecretFile, &c.Dispatch.Webhook.Secret, true},
		{"dispatch.kafka.sasl.password_file", c.Dispatch.Kafka.SASL.PasswordFile, &c.Dispatch.Kafka.SASL.Password, true},
	} {
		if f.file == "" {
			continue
		}
		if f.exclusive && *f.dst != "" {
			return &KeyError{Key: f.key, Err: fmt.Errorf("set either %s or %s, not both", strings.TrimSuffix(f.key, "_file"), f.key)}
		}
		b, err := os.ReadFile(f.file)
		if err != nil {
			return &KeyError{Key: f.key, Err: err}
		}
		*f.dst = strings.TrimSpace(string(b))
		if *f.dst == "" {
			// An empty secret file would otherwise mean "no secret":
			// unsigned webhooks or no password, without a word.
			return &KeyError{Key: f.key, Err: fmt.Errorf("file %s is empty (or only whitespace); it must hold the %s", f.file, strings.TrimSuffix(f.key, "_file"))}
		}
	}
	return nil
}

// Validate checks ranges and formats; the error names the key.
func (c *Config) Validate() error {
	bad := func(key, format string, a ...any) error {
		return &KeyError{Key: key, Err: fmt.Errorf(format, a...)}
	}
	if c.Postgres.DSN == "" {
		return bad("postgres.dsn", "must be set")
	}
	if err := validateDSN(c.Postgres.DSN); err != nil {
		return &KeyError{Key: c.sourceKey("postgres.dsn", c.Postgres.DSNFile), Err: err}
	}
	if len(c.Redis.Addrs) == 0 || slices.Contains(c.Redis.Addrs, "") {
		return bad("redis.addrs", "must list at least one host:port, without empty entries")
	}
	switch c.Redis.Mode {
	case "single", "sentinel", "cluster":
	case "redlock":
		if len(c.Redis.Addrs) < 3 {
			return bad("redis.mode", "redlock needs at least 3 independent nodes in redis.addrs, got %d", len(c.Redis.Addrs))
		}
	default:
		return bad("redis.mode", "want single, redlock, sentinel or cluster, got %q", c.Redis.Mode)
	}
	if c.Redis.Mode == "single" && len(c.Redis.Addrs) != 1 {
		return bad("redis.addrs", "mode single takes one address, got %d (use redis.mode redlock, sentinel or cluster)", len(c.Redis.Addrs))
	}
	if c.Redis.Mode == "sentinel" && c.Redis.MasterName == "" {
		return bad("redis.master_name", "must be set in sentinel mode")
	}
	if err := validateTLSFiles("redis.tls", c.Redis.TLS); err != nil {
		return err
	}
	if c.Redis.DB < 0 || c.Redis.DB > 15 {
		return bad("redis.db", "want 0..15, got %d", c.Redis.DB)
	}
	positive := []struct {
		key string
		d   time.Duration
	}{
		{"poller.lock_ttl", c.Poller.LockTTL}, {"poller.lock_wait", c.Poller.LockWait},
		{"poller.poll_interval", c.Poller.PollInterval}, {"poller.claim_ttl", c.Poller.ClaimTTL},
		{"poller.backoff_base", c.Poller.BackoffBase}, {"poller.backoff_max", c.Poller.BackoffMax},
		{"poller.gap_wait", c.Poller.GapWait},
		{"reconcile.lock_ttl", c.Reconcile.LockTTL}, {"reconcile.retention", c.Reconcile.Retention},
		{"dispatch.webhook.timeout", c.Dispatch.Webhook.Timeout}, {"shutdown_timeout", c.ShutdownTimeout},
	}
	for _, p := range positive {
		if p.d <= 0 {
			return bad(p.key, "must be a positive duration, got %s", p.d)
		}
	}
	if c.Poller.LockTTL < 300*time.Millisecond {
		return bad("poller.lock_ttl", "must be at least 300ms, got %s", c.Poller.LockTTL)
	}
	if c.Poller.BackoffMax < c.Poller.BackoffBase {
		return bad("poller.backoff_max", "must not be below poller.backoff_base (%s), got %s", c.Poller.BackoffBase, c.Poller.BackoffMax)
	}
	if c.Poller.BatchSize < 1 || c.Poller.BatchSize > 10000 {
		return bad("poller.batch_size", "want 1..10000, got %d", c.Poller.BatchSize)
	}
	if c.Poller.MaxAttempts < 1 {
		return bad("poller.max_attempts", "must be at least 1, got %d", c.Poller.MaxAttempts)
	}
	if c.Poller.Concurrency < 1 || c.Poller.Concurrency > 1024 {
		return bad("poller.concurrency", "want 1..1024, got %d", c.Poller.Concurrency)
	}
	if c.Poller.MaxPayloadBytes < minMaxPayloadBytes || c.Poller.MaxPayloadBytes > maxMaxPayloadBytes {
		return bad("poller.max_payload_bytes", "want %d..%d (1 KiB..256 MiB), got %d", minMaxPayloadBytes, maxMaxPayloadBytes, c.Poller.MaxPayloadBytes)
	}
	if c.Poller.BatchMaxBytes < c.Poller.MaxPayloadBytes {
		return bad("poller.batch_max_bytes", "must be at least poller.max_payload_bytes (%d), got %d", c.Poller.MaxPayloadBytes, c.Poller.BatchMaxBytes)
	}
	if c.Reconcile.DeadRetention < 0 {
		return bad("reconcile.dead_retention", "must be 0 (keep dead rows) or a positive duration, got %s", c.Reconcile.DeadRetention)
	}
	if c.Reconcile.DeadRetention > 0 && c.Reconcile.DeadRetention < c.Reconcile.Retention {
		return bad("reconcile.dead_retention", "must not be shorter than reconcile.retention (%s), got %s", c.Reconcile.Retention, c.Reconcile.DeadRetention)
	}
	if c.Reconcile.BatchSize < 1 || c.Reconcile.BatchSize > 100000 {
		return bad("reconcile.batch_size", "want 1..100000, got %d", c.Reconcile.BatchSize)
	}
	switch c.Dispatch.Sink {
	case "webhook":
		if err := c.validateWebhook(); err != nil {
			return err
		}
	case "kafka":
		if err := c.validateKafka(); err != nil {
			return err
		}
	case "nats":
		if f := c.Dispatch.NATS.CredsFile; f != "" {
			if _, err := os.Stat(f); err != nil {
				return bad("dispatch.nats.creds_file", "%v", err)
			}
		}
	case "rabbitmq", "redis_stream", "noop":
	default:
		return bad("dispatch.sink", "want webhook, kafka, nats, rabbitmq, redis_stream or noop, got %q", c.Dispatch.Sink)
	}
	if c.Dispatch.RedisStream.MaxLen < 0 {
		return bad("dispatch.redis_stream.maxlen", "must be 0 (no trimming) or positive, got %d", c.Dispatch.RedisStream.MaxLen)
	}
	switch strings.ToLower(c.Log.Level) {
	case "debug", "info", "warn", "error":
	default:
		return bad("log.level", "want debug, info, warn or error, got %q", c.Log.Level)
	}
	switch c.Log.Format {
	case "json", "text":
	default:
		return bad("log.format", "want json or text, got %q", c.Log.Format)
	}
	return nil
}

// sourceKey names the key a value came from: its *_file key when it was
// read from a file, so the operator looks in the right place.
func (c *Config) sourceKey(key, file string) string {
	if file != "" {
		return key + "_file"
	}
	return key
}

// validateKafka checks the Kafka settings that are plain values; the topic
// template is checked by the sink.
func (c *Config) validateKafka() error {
	k := c.Dispatch.Kafka
	if len(k.Brokers) == 0 || slices.Contains(k.Brokers, "") {
		return &KeyError{Key: "dispatch.kafka.brokers", Err: errors.New("must list at least one host:port, without empty entries")}
	}
	switch k.SASL.Mechanism {
	case "":
	case "PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512":
		if k.SASL.Username == "" {
			return &KeyError{Key: "dispatch.kafka.sasl.username", Err: fmt.Errorf("must be set with mechanism %s", k.SASL.Mechanism)}
		}
	default:
		return &KeyError{Key: "dispatch.kafka.sasl.mechanism", Err: fmt.Errorf("want PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512 (or empty), got %q", k.SASL.Mechanism)}
	}
	return validateTLSFiles("dispatch.kafka.tls", k.TLS)
}

// validateTLSFiles checks that the files of a TLS setting exist and come
// with tls.enabled.
func validateTLSFiles(prefix string, t TLS) error {
	for _, f := range []struct{ key, path string }{
		{prefix + ".ca_file", t.CAFile}, {prefix + ".cert_file", t.CertFile}, {prefix + ".key_file", t.KeyFile},
	} {
		if f.path == "" {
			continue
		}
		if !t.Enabled {
			return &KeyError{Key: f.key, Err: fmt.Errorf("set, but %s.enabled is false", prefix)}
		}
		if _, err := os.Stat(f.path); err != nil {
			return &KeyError{Key: f.key, Err: err}
		}
	}
	if (t.CertFile == "") != (t.KeyFile == "") {
		return &KeyError{Key: prefix + ".key_file", Err: fmt.Errorf("%s.cert_file and %s.key_file go together", prefix, prefix)}
	}
	return nil
}

// validateWebhook checks what concerns the webhook and another part
// together; the URL and the secret themselves are checked by the sink
// (dispatch.ParseURL, dispatch.ParseSecret) when app checks the config.
func (c *Config) validateWebhook() error {
	w := c.Dispatch.Webhook
	// The poller trusts its lease for about 0.9 x lock_ttl after the last
	// renewal, and renews every lock_ttl/3: a request longer than half the
	// TTL can be cut by the lease every time, and its row never delivered.
	if limit := c.Poller.LockTTL / 2; w.Timeout > limit {
		return &KeyError{Key: "dispatch.webhook.timeout", Err: fmt.Errorf(
			"must be at most half of poller.lock_ttl (%s), got %s: the lease is trusted for about 0.9 x poller.lock_ttl after its last renewal (renewed every poller.lock_ttl/3), so a longer request can be cut every time; lower the timeout or raise poller.lock_ttl",
			limit, w.Timeout)}
	}
	return nil
}

// SourceKey names the key a secret came from: its *_file key when it was
// read from a file, so the operator looks in the right place.
func (c *Config) SourceKey(key string) string {
	switch key {
	case "postgres.dsn":
		return c.sourceKey(key, c.Postgres.DSNFile)
	case "redis.password":
		return c.sourceKey(key, c.Redis.PasswordFile)
	case "dispatch.webhook.secret":
		return c.sourceKey(key, c.Dispatch.Webhook.SecretFile)
	}
	return key
}

// Redacted returns the effective configuration as nested maps with secrets
// replaced: redis.password and dispatch.webhook.secret whole, postgres.dsn
// and dispatch.webhook.url parsed (RedactDSN, RedactURL).
func (c *Config) Redacted() map[string]any {
	flat := map[string]any{}
	walk(reflect.ValueOf(*c), "", flat)
	for _, k := range secretKeys {
		if s, _ := flat[k].(string); s != "" {
			flat[k] = "[redacted]"
		}
	}
	flat["postgres.dsn"] = RedactDSN(c.Postgres.DSN)
	for _, k := range []string{"dispatch.webhook.url", "dispatch.nats.url", "dispatch.rabbitmq.url"} {
		flat[k] = RedactURL(flat[k].(string))
	}
	out := map[string]any{}
	for k, v := range flat {
		parts := strings.Split(k, ".")
		m := out
		for _, p := range parts[:len(parts)-1] {
			next, ok := m[p].(map[string]any)
			if !ok {
				next = map[string]any{}
				m[p] = next
			}
			m = next
		}
		if d, ok := v.(time.Duration); ok {
			v = d.String()
		}
		m[parts[len(parts)-1]] = v
	}
	return out
}

func walk(v reflect.Value, prefix string, out map[string]any) {
	t := v.Type()
	for i := range t.NumField() {
		name := t.Field(i).Tag.Get("mapstructure")
		if prefix != "" {
			name = prefix + "." + name
		}
		f := v.Field(i)
		if f.Kind() == reflect.Struct {
			walk(f, name, out)
			continue
		}
		out[name] = f.Interface()
	}
}
