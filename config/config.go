// Package config loads outboxd's typed configuration: defaults, then a YAML
// file, then OUTBOXD_<SECTION>_<KEY> environment variables, then --set
// key=value flags. Decoding is strict (unknown keys are errors) and every
// error names the key at fault.
package config

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/go-viper/mapstructure/v2"
	"github.com/spf13/viper"
)

// Config is the whole configuration. Its mapstructure tags are the key names
// of the contract (docs/reference.md, "Configuration").
type Config struct {
	Postgres        Postgres      `mapstructure:"postgres"`
	Redis           Redis         `mapstructure:"redis"`
	Lock            Lock          `mapstructure:"lock"`
	Idempotency     Idempotency   `mapstructure:"idempotency"`
	Poller          Poller        `mapstructure:"poller"`
	Reconcile       Reconcile     `mapstructure:"reconcile"`
	Dispatch        Dispatch      `mapstructure:"dispatch"`
	HTTP            HTTP          `mapstructure:"http"`
	Log             Log           `mapstructure:"log"`
	ShutdownTimeout time.Duration `mapstructure:"shutdown_timeout"`
	// InstanceID names this replica as a lock holder (/status, `outboxd
	// status`, the lock log lines' "holder").
	InstanceID string `mapstructure:"instance_id"`

	// sinkSet: dispatch.sink was set, not left at its default (see
	// TopLevelDestination).
	sinkSet bool
}

type Postgres struct {
	DSN     string `mapstructure:"dsn"`
	DSNFile string `mapstructure:"dsn_file"` // read the DSN from this file (Kubernetes secret, systemd credential)
	// Schema holds every table, index, function and trigger of outboxd's.
	Schema string `mapstructure:"schema"`
	// Pooler says what the DSN points at: the server ("none"), or a proxy
	// pooling server sessions per transaction ("transaction"), see pooler.go.
	Pooler string `mapstructure:"pooler"`
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
	Sink              string      `mapstructure:"sink"` // a name of the sink registry (cmd/outboxd/internal/app/sinks.go)
	Webhook           Webhook     `mapstructure:"webhook"`
	Kafka             Kafka       `mapstructure:"kafka"`
	NATS              NATS        `mapstructure:"nats"`
	RabbitMQ          RabbitMQ    `mapstructure:"rabbitmq"`
	RedisStream       RedisStream `mapstructure:"redis_stream"`
	PubSub            PubSub      `mapstructure:"pubsub"`
	Kinesis           Kinesis     `mapstructure:"kinesis"`
	SQS               SQS         `mapstructure:"sqs"`
	SNS               SNS         `mapstructure:"sns"`
	CloudEvents       bool        `mapstructure:"cloudevents"`        // binary-mode CloudEvents attributes on every message
	CloudEventsSource string      `mapstructure:"cloudevents_source"` // their "source"
	CloudEventsMode   string      `mapstructure:"cloudevents_mode"`   // binary | structured
	// Breaker is the destination's circuit breaker (dispatch.Breaker).
	Breaker Breaker `mapstructure:"breaker"`
	// AllowRowPrefixedDestinations accepts a destination template that
	// starts with a placeholder (refused by default: a row would choose the
	// destination's whole name).
	AllowRowPrefixedDestinations bool `mapstructure:"allow_row_prefixed_destinations"`
	// Destinations are named sinks, each configured like this section (its
	// sink and that sink's own section; not destinations or routes): see
	// Destinations. Top level only.
	Destinations map[string]*Dispatch `mapstructure:"destinations"`
	// Routes choose each event's destination, first match wins. Top level only.
	Routes []Route `mapstructure:"routes"`
}

// Breaker is a destination's circuit breaker: Failures consecutive
// failures of the destination itself open it (0: never), and while open
// one event goes as a probe every ProbeInterval.
type Breaker struct {
	Failures      int           `mapstructure:"failures"`
	ProbeInterval time.Duration `mapstructure:"probe_interval"`
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

type PubSub struct {
	Project  string `mapstructure:"project"`
	Topic    string `mapstructure:"topic"`    // template: the topic ID
	Endpoint string `mapstructure:"endpoint"` // "" = Google's (or PUBSUB_EMULATOR_HOST); http:// = emulator
}

type Kinesis struct {
	Stream   string `mapstructure:"stream"`   // template
	Region   string `mapstructure:"region"`   // "" = the AWS default chain's
	Endpoint string `mapstructure:"endpoint"` // "" = the region's
}

// SQS and SNS take credentials from the AWS SDK's default chain (no keys
// here); Region "" is the chain's, else the queue URL's or topic ARN's.
type SQS struct {
	QueueURL string `mapstructure:"queue_url"`
	Region   string `mapstructure:"region"`
	Endpoint string `mapstructure:"endpoint"` // "" = AWS's; emulators, VPC endpoints
}

type SNS struct {
	TopicARN string `mapstructure:"topic_arn"`
	Region   string `mapstructure:"region"`
	Endpoint string `mapstructure:"endpoint"`
}

type Webhook struct {
	URL        string        `mapstructure:"url"`
	Secret     string        `mapstructure:"secret"`
	SecretFile string        `mapstructure:"secret_file"`
	Timeout    time.Duration `mapstructure:"timeout"`
	// Headers are static request headers, name -> value (values are
	// secrets: redacted); HeadersFile holds more, one "Name: value" a line.
	Headers     map[string]string `mapstructure:"headers"`
	HeadersFile string            `mapstructure:"headers_file"`
	// SigningKey is a Standard Webhooks asymmetric key (whsk_...).
	SigningKey     string     `mapstructure:"signing_key"`
	SigningKeyFile string     `mapstructure:"signing_key_file"`
	TLS            WebhookTLS `mapstructure:"tls"`
}

// WebhookTLS is the webhook's TLS to an https receiver: a CA bundle and a
// client certificate (mTLS).
type WebhookTLS struct {
	CAFile   string `mapstructure:"ca_file"`
	CertFile string `mapstructure:"cert_file"`
	KeyFile  string `mapstructure:"key_file"`
}

type HTTP struct {
	Addr  string `mapstructure:"addr"`
	Pprof bool   `mapstructure:"pprof"` // serve /debug/pprof/ on http.addr (profiling; off by default)
	// AuthToken, when set, is the bearer token /metrics, /status and /dead
	// require (a secret); AuthTokenFile reads it from a file.
	AuthToken     string `mapstructure:"auth_token"`
	AuthTokenFile string `mapstructure:"auth_token_file"`
	// AuthTokensFile names more bearer tokens, one "name:token" a line
	// (# comments and blank lines skipped): the name is logged as who
	// asked for an admin write; http.auth_token is named "default".
	AuthTokensFile string `mapstructure:"auth_tokens_file"`
	// MaxConcurrent bounds the operations requests that read Postgres at
	// once; they run on a pool of their own of MaxConcurrent+1 connections
	// (the one more for /readyz), never on the delivery's.
	MaxConcurrent int `mapstructure:"max_concurrent"`
}

type Log struct {
	Level  string `mapstructure:"level"`
	Format string `mapstructure:"format"`
}

// Shortest leases accepted. A lease is renewed every third of it and
// trusted for about nine tenths of it, so it must outlast a Redis round
// trip several times over; a reconciliation's term also raises the fence
// and runs its sweeps in Postgres under it.
const (
	minPollerLockTTL    = 300 * time.Millisecond
	minReconcileLockTTL = time.Second
)

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

// secret is a setting that holds a secret, or (a DSN, a URL) may carry one.
// The table secrets is the one list of them: loading (readSecretFiles),
// showing (Redacted) and naming where a value came from (SourceKey) read it.
type secret struct {
	key     string
	file    string // the *_file key the value may be read from; "" for none
	section Section
	// exclusive: key and file cannot both be set. Otherwise the file wins
	// (postgres.dsn has a default, which a file replaces).
	exclusive bool
	// redact shows the value: replaced whole, or with its secrets parsed out.
	redact func(string) string
}

func redactWhole(v string) string {
	if v == "" {
		return ""
	}
	return "[redacted]"
}

var secrets = []secret{
	{key: "postgres.dsn", file: "postgres.dsn_file", section: PostgresSection, redact: RedactDSN},
	{key: "redis.password", file: "redis.password_file", section: RedisSection, exclusive: true, redact: redactWhole},
	{key: "lock.etcd.password", file: "lock.etcd.password_file", section: LockSection, exclusive: true, redact: redactWhole},
	{key: "dispatch.webhook.secret", file: "dispatch.webhook.secret_file", section: DispatchSection, exclusive: true, redact: redactWhole},
	{key: "dispatch.webhook.signing_key", file: "dispatch.webhook.signing_key_file", section: DispatchSection, exclusive: true, redact: redactWhole},
	{key: "dispatch.kafka.sasl.password", file: "dispatch.kafka.sasl.password_file", section: DispatchSection, exclusive: true, redact: redactWhole},
	{key: "http.auth_token", file: "http.auth_token_file", section: HTTPSection, exclusive: true, redact: redactWhole},
	{key: "dispatch.webhook.url", section: DispatchSection, redact: RedactURL},
	{key: "dispatch.nats.url", section: DispatchSection, redact: RedactURL},
	{key: "dispatch.rabbitmq.url", section: DispatchSection, redact: RedactURL},
	// Refused with credentials in them (exit 2), but shown redacted anyway.
	{key: "dispatch.sqs.queue_url", section: DispatchSection, redact: RedactURL},
	{key: "dispatch.sqs.endpoint", section: DispatchSection, redact: RedactURL},
	{key: "dispatch.sns.endpoint", section: DispatchSection, redact: RedactURL},
}

// stringField returns the string field of c that key names.
func (c *Config) stringField(key string) *string {
	v := reflect.ValueOf(c).Elem()
	for _, part := range strings.Split(key, ".") {
		if v.Kind() == reflect.Map { // a destination, by name
			v = v.MapIndex(reflect.ValueOf(part)).Elem()
			continue
		}
		t := v.Type()
		for i := range t.NumField() {
			if t.Field(i).Tag.Get("mapstructure") == part {
				v = v.Field(i)
				break
			}
		}
	}
	return v.Addr().Interface().(*string)
}

// KeyError is a configuration error about one key.
type KeyError struct {
	Key string
	Err error
}

func (e *KeyError) Error() string { return fmt.Sprintf("config: %s: %v", e.Key, e.Err) }
func (e *KeyError) Unwrap() error { return e.Err }

// Load reads file (optional: "" skips it), then the environment, then sets
// ("key=value"), and validates the sections given (all when none is: see
// Section); unknown keys and values of the wrong type are refused in every
// section. defaults must give every key's default value (Defaults): viper
// sees an environment-only value only for a key that has a default.
func Load(file string, sets []string, defaults map[string]any, sections ...Section) (*Config, error) {
	v, err := newViper(file, defaults)
	if err != nil {
		return nil, err
	}
	// Defaults of the destinations the file names go in before --set: a
	// nested override set first hides defaults set after it (viper).
	setDestinationDefaults(v, defaults)
	if err := applySets(v, sets); err != nil {
		return nil, err
	}
	if err := checkDestinationsMap(v); err != nil {
		return nil, err
	}
	setDestinationDefaults(v, defaults)
	if err := checkSettings(v); err != nil {
		return nil, err
	}
	c, err := decode(v)
	if err != nil {
		return nil, err
	}
	c.sinkSet = sinkSetExplicitly(v, sets)
	if err := c.readSecretFiles(sections); err != nil {
		return nil, err
	}
	if err := c.Validate(sections...); err != nil {
		return nil, err
	}
	return c, nil
}

// configFlag names the configuration file in errors: the flag that gives it.
const configFlag = "--config"

// newViper returns a viper holding every key's default, then file (when
// given), then the OUTBOXD_ environment.
func newViper(file string, defaults map[string]any) (*viper.Viper, error) {
	v := viper.New()
	for _, k := range Keys() {
		d, ok := defaults[k]
		if !ok {
			return nil, fmt.Errorf("config: no default given for %s", k)
		}
		v.SetDefault(k, d)
	}
	if file != "" {
		b, err := ReadFile(configFlag, file, LargeFileLimit)
		if err != nil {
			return nil, err
		}
		v.SetConfigType("yaml")
		if err := v.ReadConfig(bytes.NewReader(b)); err != nil {
			return nil, &KeyError{Key: configFlag, Err: fmt.Errorf("read %s: %w", file, err)}
		}
	}
	v.SetEnvPrefix("OUTBOXD")
	v.SetEnvKeyReplacer(strings.NewReplacer(".", "_"))
	// A variable set to "" sets the key to the empty value, as --set key=
	// and the file do: a key that cannot be empty is then refused, not
	// left at its default without a word.
	v.AllowEmptyEnv(true)
	v.AutomaticEnv()
	return v, nil
}

// applySets sets each "key=value" of --set on v, refusing an unknown key.
func applySets(v *viper.Viper, sets []string) error {
	for _, s := range sets {
		k, val, ok := strings.Cut(s, "=")
		if !ok {
			return &KeyError{Key: "--set", Err: fmt.Errorf("%q is not key=value", s)}
		}
		k = strings.ToLower(strings.TrimSpace(k))
		if _, known := typeKey(k); !known {
			return &KeyError{Key: k, Err: errors.New("unknown key")}
		}
		v.Set(k, val)
	}
	return nil
}

// checkDestinationsMap refuses a destinations value that is not a map of
// names to settings, before its entries are read as destinations.
func checkDestinationsMap(v *viper.Viper) error {
	d := v.Get(destinationsKey)
	if d == nil {
		return nil
	}
	if _, ok := d.(map[string]any); !ok {
		return &KeyError{Key: destinationsKey, Err: fmt.Errorf("want a map of destination names to their settings, got %v", d)}
	}
	return nil
}

// settingChecks run in order on the merged settings before decoding; the
// first error ends Load. joinLists rewrites list values, so it precedes
// the type check.
var settingChecks = []func(v *viper.Viper) error{
	func(v *viper.Viper) error { return checkEnvNames(os.Environ(), append(Keys(), v.AllKeys()...)) },
	checkUnknown,
	func(v *viper.Viper) error { return joinLists(v, listKeys...) },
	checkTypes,
	func(v *viper.Viper) error { return checkRoutes(v.Get(routesKey)) },
}

// checkSettings runs settingChecks.
func checkSettings(v *viper.Viper) error {
	for _, check := range settingChecks {
		if err := check(v); err != nil {
			return err
		}
	}
	return nil
}

// checkTypes checks key by key so a bad value is reported with its own key name.
func checkTypes(v *viper.Viper) error {
	for _, k := range v.AllKeys() {
		if err := checkType(k, v.Get(k)); err != nil {
			return err
		}
	}
	return nil
}

// decode unmarshals v into a Config, refusing fields it does not have, and
// trims spaces around the Redis addresses.
func decode(v *viper.Viper) (*Config, error) {
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
	c.resolveIdempotency()
	return &c, nil
}

// checkUnknown rejects keys in the file that outboxd does not know, naming them.
func checkUnknown(v *viper.Viper) error {
	for _, k := range v.AllKeys() {
		if _, ok := typeKey(k); !ok {
			return &KeyError{Key: k, Err: errors.New("unknown key")}
		}
	}
	return nil
}

// listKeys are string settings that may also be written as a YAML list
// (several webhook secrets, for rotation).
var listKeys = []string{"dispatch.webhook.secret"}

// joinLists turns a list given for one of keys into one string, an entry
// per line: the reader splits it there (webhook.ParseSecrets), as it does
// a secret_file holding one per line.
func joinLists(v *viper.Viper, keys ...string) error {
	for _, k := range keys {
		list, ok := v.Get(k).([]any)
		if !ok {
			continue
		}
		lines := make([]string, len(list))
		for i, e := range list {
			s, ok := e.(string)
			if !ok || strings.ContainsAny(s, "\r\n") {
				// Never the value: it is a secret.
				return &KeyError{Key: fmt.Sprintf("%s[%d]", k, i), Err: errors.New("want a string on one line")}
			}
			lines[i] = s
		}
		v.Set(k, strings.Join(lines, "\n"))
	}
	return nil
}

func checkType(key string, val any) error {
	tk, _ := typeKey(key)
	if err := checkShape(key, fields[tk], val); err != nil {
		return err
	}
	if durationKeys[tk] {
		return checkDuration(key, val)
	}
	s, isString := val.(string)
	if _, isMap := fields[tk].(map[string]string); isMap && !stringMapEntry(key) {
		if val != nil && reflect.ValueOf(val).Kind() != reflect.Map {
			return &KeyError{Key: key, Err: errors.New("want a map of names to values (from the environment: use the matching _file key)")}
		}
		return nil
	}
	if !isString {
		return nil
	}
	switch fields[tk].(type) {
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

// checkDuration checks the value of a duration key: a string Go's
// time.ParseDuration reads, or a time.Duration.
func checkDuration(key string, val any) error {
	if s, ok := val.(string); ok {
		if _, err := time.ParseDuration(strings.TrimSpace(s)); err != nil {
			return &KeyError{Key: key, Err: fmt.Errorf("invalid duration %q (use e.g. 500ms, 30s, 5m, 168h)", s)}
		}
		return nil
	}
	if _, ok := val.(time.Duration); !ok {
		return &KeyError{Key: key, Err: fmt.Errorf("want a duration such as \"30s\", got %v", val)}
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

// Section is a top-level part of the configuration. A command checks only
// the sections it uses (`migrate` needs postgres, not the sink), so a setting
// it never reads cannot stop it. log and shutdown_timeout are always checked.
type Section string

const (
	PostgresSection  Section = "postgres"
	RedisSection     Section = "redis"
	PollerSection    Section = "poller"
	ReconcileSection Section = "reconcile"
	DispatchSection  Section = "dispatch"
	HTTPSection      Section = "http"
	// LockSection is checked and read by every command, as lock.backend
	// is; no command names it.
	LockSection Section = "lock"
)

// AllSections is what `run` and `config` use.
var AllSections = []Section{PostgresSection, RedisSection, PollerSection, ReconcileSection, DispatchSection, HTTPSection}

// uses reports whether sections (all when empty) include s.
func uses(sections []Section, s Section) bool {
	return len(sections) == 0 || slices.Contains(sections, s)
}

// readSecretFiles fills secrets from their *_file keys (the table
// secrets), for the sections used.
func (c *Config) readSecretFiles(sections []Section) error {
	for _, sec := range c.allSecrets() {
		if sec.file == "" || (sec.section != LockSection && !uses(sections, sec.section)) {
			continue
		}
		file, dst := *c.stringField(sec.file), c.stringField(sec.key)
		if file == "" {
			continue
		}
		if sec.exclusive && *dst != "" {
			return &KeyError{Key: sec.file, Err: fmt.Errorf("set either %s or %s, not both", sec.key, sec.file)}
		}
		b, err := ReadFile(sec.file, file, SecretFileLimit)
		if err != nil {
			return err
		}
		*dst = strings.TrimSpace(string(b))
		if *dst == "" {
			// An empty secret file would otherwise mean "no secret":
			// unsigned webhooks or no password, without a word.
			return &KeyError{Key: sec.file, Err: fmt.Errorf("file %s is empty (or only whitespace); it must hold the %s", file, sec.key)}
		}
	}
	return nil
}

func bad(key, format string, a ...any) error {
	return &KeyError{Key: key, Err: fmt.Errorf(format, a...)}
}

// Validate checks ranges and formats of the sections given (all when none
// is), and always log and shutdown_timeout; the error names the key. The
// dispatch section's settings belong to its sink and are checked by the sink
// registry (cmd/outboxd/internal/app/sinks.go) through app.Check.
func (c *Config) Validate(sections ...Section) error {
	c.resolveIdempotency() // a Config built in code leaves it unset
	for _, v := range []struct {
		section Section
		check   func() error
	}{
		{PostgresSection, c.validatePostgres},
		{RedisSection, c.validateRedisUsed},
		{PollerSection, c.validatePoller},
		{ReconcileSection, c.validateReconcile},
		{HTTPSection, c.validateHTTP},
		{HTTPSection, c.validateAuthToken},
		{HTTPSection, c.validateAuthTokens},
	} {
		if !uses(sections, v.section) {
			continue
		}
		if err := v.check(); err != nil {
			return err
		}
	}
	if uses(sections, PostgresSection) && uses(sections, PollerSection) {
		if err := c.validateNotifyPooler(); err != nil {
			return err
		}
	}
	if uses(sections, DispatchSection) {
		if err := c.validateDispatch(); err != nil {
			return err
		}
	}
	if c.ShutdownTimeout <= 0 {
		return bad("shutdown_timeout", "must be a positive duration, got %s", c.ShutdownTimeout)
	}
	if err := validateInstanceID(c.InstanceID); err != nil {
		return err
	}
	if err := c.validateLock(); err != nil {
		return err
	}
	if err := c.validateIdempotency(); err != nil {
		return err
	}
	return c.validateLog()
}

// validateInstanceID: printable ASCII without spaces, at most 253 bytes
// (a DNS name's length: a host or pod name fits).
func validateInstanceID(id string) error {
	if id == "" || len(id) > 253 {
		return bad("instance_id", "want 1..253 characters (default: the host name), got %d", len(id))
	}
	for i := range len(id) {
		if id[i] <= ' ' || id[i] > '~' {
			return bad("instance_id", "want printable ASCII without spaces, got %q", id)
		}
	}
	return nil
}

// validateAuthToken: a bearer token is one header word: no spaces or
// control characters (the message never shows it).
func (c *Config) validateAuthToken() error {
	for _, r := range c.HTTP.AuthToken {
		if r <= ' ' || r == 0x7f {
			return &KeyError{Key: c.SourceKey("http.auth_token"), Err: errors.New("holds a space or a control character; a bearer token is one word")}
		}
	}
	return nil
}

// NamedToken is one line of http.auth_tokens_file.
type NamedToken struct{ Name, Token string }

// AuthTokens reads http.auth_tokens_file (none when unset): each line
// "name:token"; a name is [A-Za-z0-9_.-]+ and unique, and "default" is
// http.auth_token's. An error names the key and the line, never a token.
func (c *Config) AuthTokens() ([]NamedToken, error) {
	path := c.HTTP.AuthTokensFile
	if path == "" {
		return nil, nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, &KeyError{Key: c.SourceKey("http.auth_tokens_file"), Err: err}
	}
	var out []NamedToken
	seen := map[string]bool{"default": c.HTTP.AuthToken != ""}
	for i, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, tok, ok := strings.Cut(line, ":")
		if !ok || seen[name] || !validTokenName(name) || !validToken(tok) {
			return nil, &KeyError{Key: c.SourceKey("http.auth_tokens_file"), Err: fmt.Errorf("%s line %d: want name:token (a unique name of letters, digits, _ . -; a token of one word)", path, i+1)}
		}
		seen[name] = true
		out = append(out, NamedToken{Name: name, Token: tok})
	}
	return out, nil
}

// validTokenName: a token's name is [A-Za-z0-9_.-]+.
func validTokenName(name string) bool {
	return name != "" && strings.IndexFunc(name, func(r rune) bool {
		return r != '_' && r != '.' && r != '-' && (r < '0' || r > '9') && (r|0x20 < 'a' || r|0x20 > 'z')
	}) < 0
}

// validToken: a token is one word of printable characters.
func validToken(tok string) bool {
	return tok != "" && strings.IndexFunc(tok, func(r rune) bool { return r <= ' ' || r == 0x7f }) < 0
}

func (c *Config) validateAuthTokens() error {
	_, err := c.AuthTokens()
	return err
}

func (c *Config) validatePostgres() error {
	if c.Postgres.DSN == "" {
		return bad("postgres.dsn", "must be set")
	}
	if err := validateDSN(c.Postgres.DSN); err != nil {
		return &KeyError{Key: c.SourceKey("postgres.dsn"), Err: err}
	}
	return c.validatePooler()
}

// validateRedisUsed checks redis.* when the lease or the idempotency
// keys live there (UsesRedis): a deployment on Postgres alone may leave
// redis.addrs empty.
func (c *Config) validateRedisUsed() error {
	if !c.UsesRedis() {
		return nil
	}
	return c.validateRedis()
}

func (c *Config) validateRedis() error {
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
	if err := CheckTLSFiles("redis.tls", c.Redis.TLS); err != nil {
		return err
	}
	if c.Redis.DB < 0 || c.Redis.DB > 15 {
		return bad("redis.db", "want 0..15, got %d", c.Redis.DB)
	}
	return nil
}

// keyDuration is a duration setting and its key.
type keyDuration struct {
	key string
	d   time.Duration
}

// positive refuses the first duration that is not above zero.
func positive(durations ...keyDuration) error {
	for _, p := range durations {
		if p.d <= 0 {
			return bad(p.key, "must be a positive duration, got %s", p.d)
		}
	}
	return nil
}

func (c *Config) validatePoller() error {
	p := c.Poller
	if err := positive(
		keyDuration{"poller.lock_ttl", p.LockTTL}, keyDuration{"poller.lock_wait", p.LockWait},
		keyDuration{"poller.poll_interval", p.PollInterval}, keyDuration{"poller.claim_ttl", p.ClaimTTL},
		keyDuration{"poller.backoff_base", p.BackoffBase}, keyDuration{"poller.backoff_max", p.BackoffMax},
		keyDuration{"poller.gap_wait", p.GapWait},
	); err != nil {
		return err
	}
	if p.LockTTL < minPollerLockTTL {
		return bad("poller.lock_ttl", "must be at least %s, got %s", minPollerLockTTL, p.LockTTL)
	}
	if p.BackoffMax < p.BackoffBase {
		return bad("poller.backoff_max", "must not be below poller.backoff_base (%s), got %s", p.BackoffBase, p.BackoffMax)
	}
	if p.BatchSize < 1 || p.BatchSize > 10000 {
		return bad("poller.batch_size", "want 1..10000, got %d", p.BatchSize)
	}
	if p.MaxAttempts < 1 {
		return bad("poller.max_attempts", "must be at least 1, got %d", p.MaxAttempts)
	}
	if p.Concurrency < 1 || p.Concurrency > 1024 {
		return bad("poller.concurrency", "want 1..1024, got %d", p.Concurrency)
	}
	if p.MaxPayloadBytes < minMaxPayloadBytes || p.MaxPayloadBytes > maxMaxPayloadBytes {
		return bad("poller.max_payload_bytes", "want %d..%d (1 KiB..256 MiB), got %d", minMaxPayloadBytes, maxMaxPayloadBytes, p.MaxPayloadBytes)
	}
	if p.BatchMaxBytes < p.MaxPayloadBytes {
		return bad("poller.batch_max_bytes", "must be at least poller.max_payload_bytes (%d), got %d", p.MaxPayloadBytes, p.BatchMaxBytes)
	}
	return nil
}

func (c *Config) validateReconcile() error {
	r := c.Reconcile
	if err := positive(keyDuration{"reconcile.lock_ttl", r.LockTTL}, keyDuration{"reconcile.retention", r.Retention}); err != nil {
		return err
	}
	if r.LockTTL < minReconcileLockTTL {
		return bad("reconcile.lock_ttl", "must be at least %s, got %s", minReconcileLockTTL, r.LockTTL)
	}
	if r.DeadRetention < 0 {
		return bad("reconcile.dead_retention", "must be 0 (keep dead rows) or a positive duration, got %s", r.DeadRetention)
	}
	if r.DeadRetention > 0 && r.DeadRetention < r.Retention {
		return bad("reconcile.dead_retention", "must not be shorter than reconcile.retention (%s), got %s", r.Retention, r.DeadRetention)
	}
	if r.BatchSize < 1 || r.BatchSize > 100000 {
		return bad("reconcile.batch_size", "want 1..100000, got %d", r.BatchSize)
	}
	return nil
}

// validateHTTP requires http.addr to be host:port with a numeric port in
// 0..65535. Port 0 (a free port, logged in "outboxd started") needs a
// host: on every interface it would serve /dead and /status on a port no
// probe or firewall rule knows. The endpoints cannot be turned off (they
// are the readiness probe): an empty address is refused.
func (c *Config) validateHTTP() error {
	addr := c.HTTP.Addr
	if addr == "" {
		return bad("http.addr", "must be set to host:port (e.g. 127.0.0.1:9090); the HTTP endpoints cannot be turned off")
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return bad("http.addr", "want host:port, got %q: %v", addr, err)
	}
	n, err := strconv.ParseUint(port, 10, 16)
	if err != nil {
		return bad("http.addr", "want a port number 0..65535, got %q", port)
	}
	if ip := net.ParseIP(host); n == 0 && (host == "" || ip != nil && ip.IsUnspecified()) {
		return bad("http.addr", "port 0 (any free port) needs a host, not every interface: got %q", addr)
	}
	if c.HTTP.MaxConcurrent < 1 || c.HTTP.MaxConcurrent > 64 {
		return bad("http.max_concurrent", "want 1..64, got %d", c.HTTP.MaxConcurrent)
	}
	return nil
}

func (c *Config) validateLog() error {
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

// CheckTLSFiles checks that the files of the TLS setting under prefix
// (redis.tls, dispatch.kafka.tls) keep the file rule (CheckFile, at most
// LargeFileLimit) and come with tls.enabled.
func CheckTLSFiles(prefix string, t TLS) error {
	for _, f := range []struct{ key, path string }{
		{prefix + ".ca_file", t.CAFile}, {prefix + ".cert_file", t.CertFile}, {prefix + ".key_file", t.KeyFile},
	} {
		if f.path == "" {
			continue
		}
		if !t.Enabled {
			return &KeyError{Key: f.key, Err: fmt.Errorf("set, but %s.enabled is false", prefix)}
		}
		if err := CheckFile(f.key, f.path, LargeFileLimit); err != nil {
			return err
		}
	}
	if (t.CertFile == "") != (t.KeyFile == "") {
		return &KeyError{Key: prefix + ".key_file", Err: fmt.Errorf("%s.cert_file and %s.key_file go together", prefix, prefix)}
	}
	return nil
}

// WebhookTimeout is the effective dispatch.webhook.timeout: the value set,
// or, when it is 0 (unset), the lesser of max and half of poller.lock_ttl,
// so a default never contradicts the lease it depends on. (A value set
// above half of poller.lock_ttl is refused by the webhook's check in the
// sink registry, cmd/outboxd/internal/app/sinks.go.)
func (c *Config) WebhookTimeout(max time.Duration) time.Duration {
	return c.webhookTimeout(c.Dispatch.Webhook, max)
}

func (c *Config) webhookTimeout(w Webhook, max time.Duration) time.Duration {
	if t := w.Timeout; t > 0 {
		return t
	}
	return min(max, c.Poller.LockTTL/2)
}

// SetWebhookTimeouts sets dispatch.webhook.timeout, and each destination's,
// to its effective value (WebhookTimeout).
func (c *Config) SetWebhookTimeouts(max time.Duration) {
	c.Dispatch.Webhook.Timeout = c.WebhookTimeout(max)
	for _, d := range c.Dispatch.Destinations {
		if d != nil {
			d.Webhook.Timeout = c.webhookTimeout(d.Webhook, max)
		}
	}
}

// SourceKey names the key a secret came from: its *_file key when it was
// read from a file (the table secrets), so the operator looks in the right
// place; otherwise key itself.
func (c *Config) SourceKey(key string) string {
	for _, sec := range c.allSecrets() {
		if sec.key == key && sec.file != "" && *c.stringField(sec.file) != "" {
			return sec.file
		}
	}
	return key
}

// Redacted returns the effective configuration as nested maps with every
// setting of the table secrets shown by its redact function.
func (c *Config) Redacted() map[string]any {
	flat := map[string]any{}
	walk(reflect.ValueOf(*c), "", flat)
	for _, sec := range c.allSecrets() {
		if v, ok := flat[sec.key].(string); ok {
			flat[sec.key] = sec.redact(v)
		}
	}
	for k, v := range flat {
		if m, ok := v.(map[string]string); ok {
			flat[k] = redactValues(m)
		}
	}
	flat[routesKey] = routesShown(c.Dispatch.Routes)
	if !c.TopLevelDestination() {
		// Routed, dispatch.sink unset: the top-level section is no
		// destination, and its default sink would read as one.
		delete(flat, "dispatch.sink")
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
		if !t.Field(i).IsExported() {
			continue
		}
		name := t.Field(i).Tag.Get("mapstructure")
		if prefix != "" {
			name = prefix + "." + name
		}
		f := v.Field(i)
		if f.Kind() == reflect.Struct {
			walk(f, name, out)
			continue
		}
		if f.Kind() == reflect.Map && f.Type().Elem().Kind() == reflect.Pointer && f.Len() > 0 {
			walkDestinations(f, name, out)
			continue
		}
		out[name] = f.Interface()
	}
}
