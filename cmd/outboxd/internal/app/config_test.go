package app_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/outboxd/outboxd/cmd/outboxd/internal/app"
	"github.com/outboxd/outboxd/config"
	"github.com/outboxd/outboxd/dispatch/webhook"
	"github.com/outboxd/outboxd/poller"
)

func writeFile(t *testing.T, body string) string {
	p := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestDefaultsAreValid(t *testing.T) {
	t.Parallel()
	c, err := app.LoadConfig("", nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.Poller.LockTTL != 30*time.Second || c.Reconcile.LockTTL != 300*time.Second {
		t.Fatalf("lock TTLs %s / %s, want the contract's 30s / 300s", c.Poller.LockTTL, c.Reconcile.LockTTL)
	}
}

func TestRepositoryConfigYAMLLoads(t *testing.T) {
	t.Parallel()
	c, err := app.LoadConfig("../../../../config.yaml", nil)
	if err != nil {
		t.Fatalf("config.yaml at the repository root must run as-is: %v", err)
	}
	if c.Postgres.DSN == "" || len(c.Redis.Addrs) != 1 {
		t.Fatalf("unexpected %+v", c)
	}
	if c.Poller.MaxPayloadBytes != poller.DefaultMaxPayloadBytes || c.Poller.BatchMaxBytes != poller.DefaultBatchMaxBytes {
		t.Fatalf("config.yaml byte limits %d / %d, want the defaults", c.Poller.MaxPayloadBytes, c.Poller.BatchMaxBytes)
	}
}

func TestPrecedenceFileEnvFlag(t *testing.T) {
	file := writeFile(t, "poller:\n  batch_size: 100\n  poll_interval: 1s\nredis:\n  addrs: [\"10.0.0.1:6379\"]\n")
	t.Setenv("OUTBOXD_POLLER_BATCH_SIZE", "200")
	t.Setenv("OUTBOXD_REDIS_ADDRS", "127.0.0.1:7001, 127.0.0.1:7002,127.0.0.1:7003")
	t.Setenv("OUTBOXD_REDIS_MODE", "redlock")
	c, err := app.LoadConfig(file, []string{"poller.batch_size=300"})
	if err != nil {
		t.Fatal(err)
	}
	if c.Poller.BatchSize != 300 {
		t.Fatalf("batch_size %d, want the flag's 300", c.Poller.BatchSize)
	}
	if c.Poller.PollInterval != time.Second {
		t.Fatalf("poll_interval %s, want the file's 1s", c.Poller.PollInterval)
	}
	want := []string{"127.0.0.1:7001", "127.0.0.1:7002", "127.0.0.1:7003"}
	if strings.Join(c.Redis.Addrs, ",") != strings.Join(want, ",") {
		t.Fatalf("addrs %q, want env's %q", c.Redis.Addrs, want)
	}
}

// Not parallel, nor TestPrecedenceFileEnvFlag and TestByteLimits: they set
// OUTBOXD_* variables, which every LoadConfig reads. Go runs the parallel
// tests only once these have finished.
func TestErrorsNameTheKey(t *testing.T) {
	for _, tc := range []struct {
		name string
		file string
		env  map[string]string
		sets []string
		key  string
	}{
		{name: "bad duration", sets: []string{"poller.poll_interval=soon"}, key: "poller.poll_interval"},
		{name: "bad duration in file", file: "reconcile:\n  retention: forever\n", key: "reconcile.retention"},
		{name: "number as duration", file: "poller:\n  lock_ttl: 30\n", key: "poller.lock_ttl"},
		{name: "bad cron", sets: []string{"reconcile.schedule=every five minutes"}, key: "reconcile.schedule"},
		{name: "negative batch size", sets: []string{"poller.batch_size=-5"}, key: "poller.batch_size"},
		{name: "non-numeric batch size", env: map[string]string{"OUTBOXD_POLLER_BATCH_SIZE": "lots"}, key: "poller.batch_size"},
		{name: "unknown key in file", file: "poller:\n  batchsize: 5\n", key: "poller.batchsize"},
		{name: "unknown key in --set", sets: []string{"poller.nope=1"}, key: "poller.nope"},
		{name: "bad mode", sets: []string{"redis.mode=magic"}, key: "redis.mode"},
		{name: "redlock with one node", sets: []string{"redis.mode=redlock"}, key: "redis.mode"},
		{name: "bad url", sets: []string{"dispatch.webhook.url=ftp://x"}, key: "dispatch.webhook.url"},
		{name: "bad sink", sets: []string{"dispatch.sink=carrier-pigeon"}, key: "dispatch.sink"},
		{name: "kafka without brokers", sets: []string{"dispatch.sink=kafka"}, key: "dispatch.kafka.brokers"},
		{name: "bad kafka sasl", sets: []string{"dispatch.sink=kafka", "dispatch.kafka.brokers=b:9092", "dispatch.kafka.sasl.mechanism=GSSAPI"}, key: "dispatch.kafka.sasl.mechanism"},
		{name: "bad topic template", sets: []string{"dispatch.sink=kafka", "dispatch.kafka.brokers=b:9092", "dispatch.kafka.topic=outbox.{aggregate}"}, key: "dispatch.kafka.topic"},
		{name: "bad subject template", sets: []string{"dispatch.sink=nats", "dispatch.nats.subject=x.{nope}"}, key: "dispatch.nats.subject"},
		{name: "negative maxlen", sets: []string{"dispatch.sink=redis_stream", "dispatch.redis_stream.maxlen=-1"}, key: "dispatch.redis_stream.maxlen"},
		{name: "sqs without queue", sets: []string{"dispatch.sink=sqs"}, key: "dispatch.sqs.queue_url"},
		{name: "bad sqs queue url", sets: []string{"dispatch.sink=sqs", "dispatch.sqs.queue_url=https://sqs.us-east-1.amazonaws.com/orders"}, key: "dispatch.sqs.queue_url"},
		{name: "bad sqs region", sets: []string{"dispatch.sink=sqs", "dispatch.sqs.queue_url=https://sqs.us-east-1.amazonaws.com/123456789012/q", "dispatch.sqs.region=mars"}, key: "dispatch.sqs.region"},
		{name: "bad sqs endpoint", sets: []string{"dispatch.sink=sqs", "dispatch.sqs.queue_url=https://sqs.us-east-1.amazonaws.com/123456789012/q", "dispatch.sqs.endpoint=localhost:4566"}, key: "dispatch.sqs.endpoint"},
		{name: "sns without topic", sets: []string{"dispatch.sink=sns"}, key: "dispatch.sns.topic_arn"},
		{name: "bad sns topic arn", sets: []string{"dispatch.sink=sns", "dispatch.sns.topic_arn=orders"}, key: "dispatch.sns.topic_arn"},
		{name: "bad sns endpoint", sets: []string{"dispatch.sink=sns", "dispatch.sns.topic_arn=arn:aws:sns:us-east-1:123456789012:t", "dispatch.sns.endpoint=ftp://x"}, key: "dispatch.sns.endpoint"},
		{name: "bad level", sets: []string{"log.level=loud"}, key: "log.level"},
		{name: "zero shutdown", sets: []string{"shutdown_timeout=0s"}, key: "shutdown_timeout"},
		{name: "bad bool", sets: []string{"poller.notify=maybe"}, key: "poller.notify"},
		{name: "bad cloudevents mode", sets: []string{"dispatch.cloudevents=true", "dispatch.cloudevents_mode=batch"}, key: "dispatch.cloudevents_mode"},
		{name: "structured without cloudevents", sets: []string{"dispatch.cloudevents_mode=structured"}, key: "dispatch.cloudevents_mode"},
		{name: "secret list entry not a string", file: "dispatch:\n  webhook:\n    secret: [whsec_AAAA, {a: 1}]\n", key: "dispatch.webhook.secret[1]"},
		{name: "bad pooler", sets: []string{"postgres.pooler=session"}, key: "postgres.pooler"},
		{name: "bad lock backend", sets: []string{"lock.backend=zookeeper"}, key: "lock.backend"},
		{name: "etcd without endpoints", sets: []string{"lock.backend=etcd"}, key: "lock.etcd.endpoints"},
		{name: "etcd with an empty endpoint", sets: []string{"lock.backend=etcd", "lock.etcd.endpoints=127.0.0.1:2379,"}, key: "lock.etcd.endpoints"},
		{name: "etcd dial timeout zero", sets: []string{"lock.backend=etcd", "lock.etcd.endpoints=127.0.0.1:2379", "lock.etcd.dial_timeout=0s"}, key: "lock.etcd.dial_timeout"},
		{name: "etcd password without username", sets: []string{"lock.backend=etcd", "lock.etcd.endpoints=127.0.0.1:2379", "lock.etcd.password=x"}, key: "lock.etcd.username"},
		{name: "etcd lease of a fraction of a second", sets: []string{"lock.backend=etcd", "lock.etcd.endpoints=127.0.0.1:2379", "poller.lock_ttl=2500ms"}, key: "poller.lock_ttl"},
		{name: "etcd lease below its minimum", sets: []string{"lock.backend=etcd", "lock.etcd.endpoints=127.0.0.1:2379", "reconcile.lock_ttl=1s"}, key: "reconcile.lock_ttl"},
		{name: "etcd TLS file without TLS", sets: []string{"lock.backend=etcd", "lock.etcd.endpoints=127.0.0.1:2379", "lock.etcd.tls.ca_file=/etc/hostname"}, key: "lock.etcd.tls.ca_file"},
		{name: "bad idempotency store", sets: []string{"idempotency.store=etcd"}, key: "idempotency.store"},
		{name: "keys in redis without redis.addrs", sets: []string{"lock.backend=postgres", "idempotency.store=redis", "redis.addrs="}, key: "redis.addrs"},
		{name: "redis_stream on postgres alone without its addr", sets: []string{"lock.backend=postgres", "dispatch.sink=redis_stream"}, key: "dispatch.redis_stream.addr"},
		{name: "bad schema", sets: []string{"postgres.schema=Outbox-1"}, key: "postgres.schema"},
		{name: "system schema pg_catalog", sets: []string{"postgres.schema=pg_catalog"}, key: "postgres.schema"},
		{name: "system schema pg_temp", sets: []string{"postgres.schema=pg_temp"}, key: "postgres.schema"},
		{name: "system schema pg_anything", sets: []string{"postgres.schema=pg_outbox"}, key: "postgres.schema"},
		{name: "system schema information_schema", file: "postgres:\n  schema: information_schema\n", key: "postgres.schema"},
		{name: "negative breaker failures", sets: []string{"dispatch.breaker.failures=-1"}, key: "dispatch.breaker.failures"},
		{name: "zero probe interval", sets: []string{"dispatch.breaker.probe_interval=0s"}, key: "dispatch.breaker.probe_interval"},
		{name: "negative probe interval", env: map[string]string{"OUTBOXD_DISPATCH_BREAKER_PROBE_INTERVAL": "-1s"}, key: "dispatch.breaker.probe_interval"},
		{name: "a destination's negative breaker failures", file: "dispatch:\n  destinations:\n    audit:\n      sink: noop\n      breaker: {failures: -3}\n",
			key: "dispatch.destinations.audit.breaker.failures"},
		{name: "a destination's zero probe interval", file: "dispatch:\n  destinations:\n    audit:\n      sink: noop\n      breaker: {probe_interval: 0s}\n",
			key: "dispatch.destinations.audit.breaker.probe_interval"},
		{name: "empty variable of a key that cannot be empty", env: map[string]string{"OUTBOXD_HTTP_ADDR": ""}, key: "http.addr"},
		{name: "empty variable of a number", env: map[string]string{"OUTBOXD_POLLER_BATCH_SIZE": ""}, key: "poller.batch_size"},
		{name: "empty variable of a list that cannot be empty", env: map[string]string{"OUTBOXD_REDIS_ADDRS": ""}, key: "redis.addrs"},
		{name: "misspelt variable of a destination", env: map[string]string{"OUTBOXD_DISPATCH_DESTINATIONS_PAYMENTS_SINK": "kafka",
			"OUTBOXD_DISPATCH_DESTINATIONS_PAYMENTS_KAFKA_BROKERS": "b:9092", "OUTBOXD_DISPATCH_DESTINATIONS_PAYMENTS_KAFKA_TOPPIC": "payments"},
			key: "OUTBOXD_DISPATCH_DESTINATIONS_PAYMENTS_KAFKA_TOPPIC"},
		{name: "variable of an unknown destination's key", file: "dispatch:\n  destinations:\n    payments:\n      sink: noop\n",
			env: map[string]string{"OUTBOXD_DISPATCH_DESTINATIONS_PAYMENTS_KAFKA_TOPPIC": "payments"}, key: "OUTBOXD_DISPATCH_DESTINATIONS_PAYMENTS_KAFKA_TOPPIC"},
		{name: "notify behind a transaction pooler", sets: []string{"postgres.pooler=transaction", "poller.notify=true"}, key: "poller.notify"},
		{name: "env variable of no key", env: map[string]string{"OUTBOXD_POLER_BATCH_SIZE": "10"}, key: "OUTBOXD_POLER_BATCH_SIZE"},
		{name: "env variable of a section", env: map[string]string{"OUTBOXD_POLLER": "x"}, key: "OUTBOXD_POLLER"},
		{name: "list for a string", file: "dispatch:\n  webhook:\n    url: [1, 2]\n", key: "dispatch.webhook.url"},
		{name: "list for a number", file: "poller:\n  batch_size: [1]\n", key: "poller.batch_size"},
		{name: "list for a bool", file: "poller:\n  notify: [true]\n", key: "poller.notify"},
		{name: "list for a duration", file: "poller:\n  lock_ttl: [30s]\n", key: "poller.lock_ttl"},
		{name: "list of lists", file: "dispatch:\n  kafka:\n    brokers: [[a, b]]\n", key: "dispatch.kafka.brokers[0]"},
		{name: "map for a list", file: "redis:\n  addrs: {a: b}\n", key: "redis.addrs.a"},
		{name: "bad secret in a list", file: "dispatch:\n  webhook:\n    secret: [whsec_AAAA, whsec_!!]\n", key: "dispatch.webhook.secret"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if len(tc.env) == 0 {
				t.Parallel() // t.Setenv forbids it, and the parent with it
			}
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			file := ""
			if tc.file != "" {
				file = writeFile(t, tc.file)
			}
			_, err := app.LoadConfig(file, tc.sets)
			var ke *config.KeyError
			if !errors.As(err, &ke) || ke.Key != tc.key || !strings.Contains(err.Error(), tc.key) {
				t.Fatalf("got %v, want a KeyError naming %s", err, tc.key)
			}
		})
	}
}

func TestRedactedHidesSecrets(t *testing.T) {
	t.Parallel()
	c, err := app.LoadConfig("", []string{
		"postgres.dsn=postgres://app:pg-s3cret@db:5432/app",
		"redis.password=redis-s3cret",
		"dispatch.webhook.secret=whsec_d2ViaG9vay1zM2NyZXQ=",
		"dispatch.webhook.url=https://hook:url-s3cret@receiver.example/in?token=tok-s3cret&tenant=7",
	})
	if err != nil {
		t.Fatal(err)
	}
	out := strings.ToLower(strings.Join(flatten(c.Redacted()), " "))
	for _, s := range []string{"pg-s3cret", "redis-s3cret", "d2viaG9vay1zM2NyZXQ", "url-s3cret", "tok-s3cret"} {
		if strings.Contains(out, strings.ToLower(s)) {
			t.Fatalf("redacted config shows %q: %s", s, out)
		}
	}
	for _, want := range []string{"dsn=postgres://app:redacted@db:5432/app", "url=https://hook:redacted@receiver.example/in?token=redacted&tenant=7"} {
		if !strings.Contains(out, want) {
			t.Fatalf("redacted config lacks %q (a secret's neighbours must stay): %s", want, out)
		}
	}
}

// Every key that can hold a secret is redacted by Redacted(): a new such key
// must be added to this table (and to the redaction) to pass.
func TestRedactedCoversEverySecretKey(t *testing.T) {
	t.Parallel()
	cases := map[string]struct{ value, canary string }{
		"postgres.dsn":                 {"host=db user=app password='pg canary' dbname=app", "canary"},
		"redis.password":               {"canary", "canary"},
		"lock.etcd.password":           {"canary", "canary"},
		"dispatch.webhook.secret":      {"canary", "canary"},
		"dispatch.webhook.url":         {"https://u:canary@h/x?api_key=canary2", "canary"},
		"dispatch.kafka.sasl.password": {"canary", "canary"},
		"dispatch.nats.url":            {"nats://u:canary@h:4222", "canary"},
		"dispatch.rabbitmq.url":        {"amqp://guest:canary@h:5672/", "canary"},
		"dispatch.sqs.queue_url":       {"https://u:canary@sqs.us-east-1.amazonaws.com/123456789012/q", "canary"},
		"http.auth_token":              {"canary", "canary"},
	}
	for _, key := range config.Keys() {
		if strings.HasSuffix(key, "_file") {
			continue // a path, shown on purpose
		}
		for _, w := range []string{"password", "secret", "dsn", "url", "token", "credential"} {
			if strings.Contains(key, w) {
				if _, ok := cases[key]; !ok {
					t.Errorf("key %s looks secret but has no redaction case here", key)
				}
			}
		}
	}
	for key, tc := range cases {
		c, err := app.LoadConfig("", []string{key + "=" + tc.value})
		if err != nil {
			t.Fatalf("%s: %v", key, err)
		}
		if out := strings.Join(flatten(c.Redacted()), " "); strings.Contains(out, tc.canary) {
			t.Errorf("%s: redacted config shows the secret: %s", key, out)
		}
	}
}

func TestRedactDSN(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ dsn, want string }{
		// URL form: the password wherever pgx reads one, nothing else touched.
		{"postgres://app:pg-s3cret@db:5432/app", "postgres://app:redacted@db:5432/app"},
		{"postgres://u:pa#ss@h/db", "postgres://u:redacted@h/db"},
		{"postgres://u:p@ss:w@rd@h/db", "[redacted: unparsable DSN]"}, // pgx reads host "ss:w@rd@h": ambiguous
		{"postgresql://u:p%40ss@h1:5432,h2:5433/db?sslmode=require&sslpassword=kp&application_name=x",
			"postgresql://u:redacted@h1:5432,h2:5433/db?sslmode=require&sslpassword=redacted&application_name=x"},
		{"postgres://u@h/db?password=q&pass%77ord=r", "postgres://u@h/db?password=redacted&pass%77ord=redacted"},
		{"postgres://u@h/db", "postgres://u@h/db"},
		// key=value form: spaces around '=', quotes, escapes, sslpassword.
		{"host=h password = x user=u", "host=h password = redacted user=u"},
		{"host=h password='a b' dbname=d", "host=h password=redacted dbname=d"},
		{`host=h password='it\'s' user=u`, "host=h password=redacted user=u"},
		{`host=h password=a\ b user=u`, "host=h password=redacted user=u"},
		{"host=h sslpassword=zz dbname=d", "host=h sslpassword=redacted dbname=d"},
		{"host=h\tpassword=tab\nuser=u", "host=h\tpassword=redacted\nuser=u"},
		// Unparsable: never the text.
		{"host=h password=a b", "[redacted: unparsable DSN]"},
		{"host=h password='unterminated", "[redacted: unparsable DSN]"},
		{"postgres://a b:pw@h/db", "[redacted: unparsable DSN]"},
		{"postgres://u:pw@h:port/db", "[redacted: unparsable DSN]"},
		{"", ""},
	} {
		if got := config.RedactDSN(tc.dsn); got != tc.want {
			t.Errorf("RedactDSN(%q) = %q, want %q", tc.dsn, got, tc.want)
		}
	}
}

func TestRedactURL(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ url, want string }{
		{"https://user:hunter2@h/x?token=abc&a=1", "https://user:redacted@h/x?token=redacted&a=1"},
		{"https://h/x?api_key=1&X-Amz-Signature=2&page=3;sig=4", "https://h/x?api_key=redacted&X-Amz-Signature=redacted&page=3;sig=redacted"},
		{"https://h/x?Access%5FToken=1&code=2&session_id=3&Authorization=4&credentials=5&client_secret=6&passwd=7",
			"https://h/x?Access%5FToken=redacted&code=redacted&session_id=redacted&Authorization=redacted&credentials=redacted&client_secret=redacted&passwd=redacted"},
		{"https://tok3n@h/", "https://redacted@h/"},
		{"https://h/x#access_token=1", "https://h/x#redacted"},
		{"http://127.0.0.1:8081/events", "http://127.0.0.1:8081/events"},
		{"http://u:p/ss@h/", "[redacted: unparsable URL]"},
		{"http://h/%zz?token=1", "[redacted: unparsable URL]"},
		{"", ""},
	} {
		if got := config.RedactURL(tc.url); got != tc.want {
			t.Errorf("RedactURL(%q) = %q, want %q", tc.url, got, tc.want)
		}
	}
}

// Secrets that cannot work are refused at load, naming the key
// they came from, without echoing them.
func TestBadSecretsAreRefused(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	file := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	for _, tc := range []struct {
		name   string
		sets   []string
		key    string
		secret string // must not appear in the error
	}{
		{"whsec not base64", []string{"dispatch.webhook.secret=whsec_!!!sekrit"}, "dispatch.webhook.secret", "sekrit"},
		{"whsec bad padding", []string{"dispatch.webhook.secret=whsec_c2VjcmV0LX"}, "dispatch.webhook.secret", "c2VjcmV0"},
		{"whsec no bytes", []string{"dispatch.webhook.secret=whsec_"}, "dispatch.webhook.secret", ""},
		{"whsec from file", []string{"dispatch.webhook.secret_file=" + file("whsec", "whsec_%%%sekrit\n")}, "dispatch.webhook.secret_file", "sekrit"},
		{"dsn key=value unquoted space", []string{"postgres.dsn=host=h password=pw sekrit dbname=d"}, "postgres.dsn", "sekrit"},
		{"dsn unterminated quote", []string{"postgres.dsn=host=h password='sekrit"}, "postgres.dsn", "sekrit"},
		{"dsn URL bad escape", []string{"postgres.dsn=postgres://u:sek%zzrit@h/db"}, "postgres.dsn", "sek"},
		{"dsn URL password in the port", []string{"postgres.dsn=postgres://u@h:sekrit@x/db"}, "postgres.dsn", "sekrit"},
		{"dsn bad sslmode", []string{"postgres.dsn=postgres://u:sekrit@h/db?sslmode=sometimes"}, "postgres.dsn", "sekrit"},
		{"dsn file unparsable", []string{"postgres.dsn_file=" + file("dsn", "postgres://a b:sekrit@h/db\n")}, "postgres.dsn_file", "sekrit"},
		{"empty secret_file", []string{"dispatch.webhook.secret_file=" + file("empty", "")}, "dispatch.webhook.secret_file", ""},
		{"blank password_file", []string{"redis.password_file=" + file("blank", " \n\t\n")}, "redis.password_file", ""},
		{"empty dsn_file", []string{"postgres.dsn_file=" + file("empty-dsn", "\n")}, "postgres.dsn_file", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := app.LoadConfig("", tc.sets)
			var ke *config.KeyError
			if !errors.As(err, &ke) || ke.Key != tc.key {
				t.Fatalf("got %v, want a KeyError naming %s", err, tc.key)
			}
			if tc.secret != "" && strings.Contains(err.Error(), tc.secret) {
				t.Fatalf("error echoes the secret: %v", err)
			}
		})
	}
	// What must keep working: a valid whsec_, a raw secret, DSNs in both forms.
	for _, sets := range [][]string{
		{"dispatch.webhook.secret=whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"},
		{"dispatch.webhook.secret=demo-secret"},
		{"postgres.dsn=host=127.0.0.1 port=5432 user=postgres password='a b' dbname=postgres sslmode=disable"},
		{"postgres.dsn=postgres://u:pa#ss@127.0.0.1:5432/db?sslmode=disable&pool_max_conns=4"},
	} {
		if _, err := app.LoadConfig("", sets); err != nil {
			t.Errorf("%v: %v", sets, err)
		}
	}
}

func TestDSNErrorText(t *testing.T) {
	t.Parallel()
	_, err := app.LoadConfig("", []string{"postgres.dsn=host=h password=pw sekrit dbname=d"})
	want := "config: postgres.dsn: cannot be parsed as a key=value DSN: a value holds a space but is not quoted (want host=h port=5432 user=u password='quote it if it holds spaces' dbname=db; the DSN is not shown, it may hold a password)"
	if err == nil || !strings.HasPrefix(err.Error(), want) {
		t.Fatalf("got %v, want it to start %q", err, want)
	}
	_, err = app.LoadConfig("", []string{"postgres.dsn=postgres://u:pw@h/db?sslmode=sometimes"})
	want = "config: postgres.dsn: pgx rejects this URL DSN: failed to configure TLS (sslmode is invalid) (want postgres://user:password@host:5432/db?sslmode=disable, reserved characters percent-encoded; the DSN is not shown, it may hold a password)"
	if err == nil || !strings.HasPrefix(err.Error(), want) {
		t.Fatalf("got %v, want it to start %q", err, want)
	}
}

// A webhook request must fit well inside the lease. Unset, the timeout
// follows the lease (the lesser of 10s and poller.lock_ttl/2); only a value
// the operator set that cannot work is an error.
func TestWebhookTimeoutFitsTheLease(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		sets []string
		want time.Duration // effective timeout
		err  string
	}{
		{nil, 10 * time.Second, ""}, // defaults: 10s within 30s
		{[]string{"dispatch.webhook.timeout=15s"}, 15 * time.Second, ""},
		{[]string{"poller.lock_ttl=2s", "dispatch.webhook.timeout=1s"}, time.Second, ""},
		{[]string{"poller.lock_ttl=10s"}, 5 * time.Second, ""},
		{[]string{"poller.lock_ttl=3s"}, 1500 * time.Millisecond, ""},
		{[]string{"poller.lock_ttl=3s", "dispatch.webhook.timeout=0s"}, 1500 * time.Millisecond, ""},
		{[]string{"dispatch.webhook.timeout=20s"}, 0, "config: dispatch.webhook.timeout: must be at most half of poller.lock_ttl (15s), got 20s"},
		{[]string{"poller.lock_ttl=10s", "dispatch.webhook.timeout=10s"}, 0, "config: dispatch.webhook.timeout: must be at most half of poller.lock_ttl (5s), got 10s"},
		{[]string{"dispatch.webhook.timeout=-1s"}, 0, "config: dispatch.webhook.timeout: must be positive, or 0"},
		{[]string{"poller.lock_ttl=1s", "dispatch.sink=noop", "dispatch.webhook.timeout=1h"}, time.Hour, ""}, // no webhook, no request
	} {
		c, err := app.LoadConfig("", tc.sets)
		switch {
		case tc.err == "" && err != nil:
			t.Errorf("%v: %v", tc.sets, err)
		case tc.err != "" && (err == nil || !strings.HasPrefix(err.Error(), tc.err)):
			t.Errorf("%v: got %v, want %q...", tc.sets, err, tc.err)
		case err == nil && c.Dispatch.Webhook.Timeout != tc.want:
			t.Errorf("%v: effective dispatch.webhook.timeout %s, want %s", tc.sets, c.Dispatch.Webhook.Timeout, tc.want)
		}
	}
}

// A command checks only the sections it uses: a sink setting that cannot
// work does not stop the loading for migrate (postgres) or status
// (postgres, redis), and does stop it for run (all sections).
func TestCommandsCheckTheSectionsTheyUse(t *testing.T) {
	t.Parallel()
	badSink := [][]string{
		{"poller.lock_ttl=3s", "dispatch.webhook.timeout=10s"},
		{"dispatch.sink=carrier-pigeon"},
		{"dispatch.webhook.url=ftp://example.com/"},
		{"dispatch.webhook.secret_file=/nonexistent/secret"},
		{"dispatch.sink=kafka"}, // no brokers
	}
	for _, sets := range badSink {
		for _, uses := range [][]config.Section{
			{config.PostgresSection},
			{config.PostgresSection, config.RedisSection},
			{config.PostgresSection, config.RedisSection, config.ReconcileSection, config.PollerSection},
		} {
			if _, err := app.LoadConfig("", sets, uses...); err != nil {
				t.Errorf("%v with sections %v: %v", sets, uses, err)
			}
		}
		var ke *config.KeyError
		if _, err := app.LoadConfig("", sets); !errors.As(err, &ke) || !strings.HasPrefix(ke.Key, "dispatch.") {
			t.Errorf("%v with every section: got %v, want a dispatch.* key error", sets, err)
		}
	}
	// What a command uses is still checked.
	if _, err := app.LoadConfig("", []string{"postgres.dsn=postgres://a b c:%zz@"}, config.PostgresSection); err == nil {
		t.Error("a bad postgres.dsn passed the postgres section")
	}
	if _, err := app.LoadConfig("", []string{"reconcile.schedule=CRON_TZ=UTC"}, config.ReconcileSection); err == nil {
		t.Error("a bad reconcile.schedule passed the reconcile section")
	}
}

// The poller's byte limits.
func TestByteLimits(t *testing.T) {
	c, err := app.LoadConfig("", nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.Poller.MaxPayloadBytes != 1<<20 || c.Poller.BatchMaxBytes != 16<<20 {
		t.Fatalf("defaults %d / %d, want 1 MiB / 16 MiB", c.Poller.MaxPayloadBytes, c.Poller.BatchMaxBytes)
	}
	t.Setenv("OUTBOXD_POLLER_MAX_PAYLOAD_BYTES", "4096")
	t.Setenv("OUTBOXD_POLLER_BATCH_MAX_BYTES", "65536")
	if c, err = app.LoadConfig("", nil); err != nil {
		t.Fatal(err)
	}
	if c.Poller.MaxPayloadBytes != 4096 || c.Poller.BatchMaxBytes != 65536 {
		t.Fatalf("env gave %d / %d, want 4096 / 65536", c.Poller.MaxPayloadBytes, c.Poller.BatchMaxBytes)
	}
	for _, tc := range []struct {
		sets []string
		err  string
	}{
		{[]string{"poller.max_payload_bytes=1023"}, "config: poller.max_payload_bytes: want 1024..268435456 (1 KiB..256 MiB), got 1023"},
		{[]string{"poller.max_payload_bytes=268435457", "poller.batch_max_bytes=300000000"}, "config: poller.max_payload_bytes: want 1024..268435456"},
		{[]string{"poller.max_payload_bytes=70000"}, "config: poller.batch_max_bytes: must be at least poller.max_payload_bytes (70000), got 65536"},
		{[]string{"poller.batch_max_bytes=lots"}, "config: poller.batch_max_bytes: want an integer"},
	} {
		if _, err := app.LoadConfig("", tc.sets); err == nil || !strings.HasPrefix(err.Error(), tc.err) {
			t.Errorf("%v: got %v, want %q...", tc.sets, err, tc.err)
		}
	}
}

func flatten(m map[string]any) []string {
	var out []string
	for k, v := range m {
		if sub, ok := v.(map[string]any); ok {
			out = append(out, flatten(sub)...)
			continue
		}
		out = append(out, k+"="+strings.TrimSpace(strings.ReplaceAll(strings.ReplaceAll(toString(v), "\n", " "), "\t", " ")))
	}
	return out
}

func toString(v any) string {
	switch x := v.(type) {
	case string:
		return x
	case []string:
		return strings.Join(x, ",")
	default:
		return ""
	}
}

func TestSecretFiles(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	dsn := write("dsn", "postgres://app:pw@db:5432/app\n")
	secret := write("secret", "  s3cret\n")
	c, err := app.LoadConfig("", []string{"postgres.dsn_file=" + dsn, "dispatch.webhook.secret_file=" + secret})
	if err != nil {
		t.Fatal(err)
	}
	if c.Postgres.DSN != "postgres://app:pw@db:5432/app" || c.Dispatch.Webhook.Secret != "s3cret" {
		t.Fatalf("dsn %q secret %q: want the files' trimmed contents", c.Postgres.DSN, c.Dispatch.Webhook.Secret)
	}
	// lock.etcd is read by every command, whatever sections it uses.
	c, err = app.LoadConfig("", []string{"lock.etcd.password_file=" + secret}, config.PostgresSection)
	if err != nil || c.Lock.Etcd.Password != "s3cret" {
		t.Fatalf("lock.etcd.password from its file: %v, set %t; want the file's trimmed contents", err, c != nil && c.Lock.Etcd.Password == "s3cret")
	}
	for _, tc := range []struct {
		sets []string
		key  string
	}{
		{[]string{"redis.password=x", "redis.password_file=" + secret}, "redis.password_file"},
		{[]string{"lock.etcd.password=x", "lock.etcd.password_file=" + secret}, "lock.etcd.password_file"},
		{[]string{"dispatch.webhook.secret_file=" + filepath.Join(dir, "missing")}, "dispatch.webhook.secret_file"},
		{[]string{"redis.tls.ca_file=" + secret}, "redis.tls.ca_file"},
		{[]string{"redis.tls.enabled=true", "redis.tls.ca_file=" + filepath.Join(dir, "missing")}, "redis.tls.ca_file"},
		{[]string{"redis.tls.enabled=true", "redis.tls.cert_file=" + secret}, "redis.tls.key_file"},
	} {
		_, err := app.LoadConfig("", tc.sets)
		var ke *config.KeyError
		if !errors.As(err, &ke) || ke.Key != tc.key {
			t.Errorf("%v: got %v, want a KeyError naming %s", tc.sets, err, tc.key)
		}
	}
}

// Several webhook secrets (rotation): a YAML list reaches the sink one per
// line, the current first, and the redacted configuration shows none.
func TestWebhookSecretList(t *testing.T) {
	t.Parallel()
	file := writeFile(t, "dispatch:\n  webhook:\n    secret:\n      - whsec_bmV3LXNlY3JldA==\n      - whsec_b2xkLXNlY3JldA==\n")
	c, err := app.LoadConfig(file, nil)
	if err != nil {
		t.Fatal(err)
	}
	keys, err := webhook.ParseSecrets(c.Dispatch.Webhook.Secret)
	if err != nil || len(keys) != 2 || string(keys[0]) != "new-secret" || string(keys[1]) != "old-secret" {
		t.Fatalf("secrets %q (%v), want new-secret then old-secret", keys, err)
	}
	out := strings.Join(flatten(c.Redacted()), " ")
	if strings.Contains(out, "bmV3") || strings.Contains(out, "b2xk") {
		t.Fatalf("redacted config shows a secret: %s", out)
	}
}

// Every sink sends CloudEvents in both modes: structured loads for each,
// also on a named destination (Pub/Sub and Kinesis refused it before).
func TestStructuredCloudEventsLoadForEverySink(t *testing.T) {
	t.Parallel()
	for _, sets := range [][]string{
		{"dispatch.sink=kinesis"},
		{"dispatch.sink=pubsub", "dispatch.pubsub.project=p"},
		{"dispatch.sink=sqs", "dispatch.sqs.queue_url=https://sqs.us-east-1.amazonaws.com/123456789012/q"},
		{"dispatch.sink=sns", "dispatch.sns.topic_arn=arn:aws:sns:us-east-1:123456789012:t"},
	} {
		if _, err := app.LoadConfig("", append(sets, "dispatch.cloudevents=true", "dispatch.cloudevents_mode=structured")); err != nil {
			t.Errorf("%v, structured: %v", sets, err)
		}
	}
	file := writeFile(t, "dispatch:\n  destinations:\n    q:\n      sink: pubsub\n      pubsub: {project: p}\n      cloudevents: true\n      cloudevents_mode: structured\n")
	if _, err := app.LoadConfig(file, nil); err != nil {
		t.Errorf("a pubsub destination in structured mode: %v", err)
	}
}

// An OUTBOXD_* variable of no key names the nearest key when one is close;
// OUTBOXD_TEST_* and a named destination's variables are accepted.
func TestEnvironmentNames(t *testing.T) {
	t.Setenv("OUTBOXD_POLER_BATCH_SIZE", "10")
	_, err := app.LoadConfig("", nil)
	if err == nil || !strings.Contains(err.Error(), "OUTBOXD_POLLER_BATCH_SIZE (key poller.batch_size)") {
		t.Errorf("got %v, want the nearest key named", err)
	}
	os.Unsetenv("OUTBOXD_POLER_BATCH_SIZE")
	t.Setenv("OUTBOXD_ZZZ", "1")
	if _, err := app.LoadConfig("", nil); err == nil || strings.Contains(err.Error(), "did you mean") {
		t.Errorf("got %v, want an error without a suggestion", err)
	}
	os.Unsetenv("OUTBOXD_ZZZ")
	t.Setenv("OUTBOXD_TEST_ANYTHING", "1")
	t.Setenv("OUTBOXD_DISPATCH_DESTINATIONS_AUDIT_SINK", "nats")
	t.Setenv("OUTBOXD_DISPATCH_DESTINATIONS_AUDIT_NATS_SUBJECT", "audit")
	t.Setenv("OUTBOXD_POLLER_BATCH_SIZE", "10")
	if _, err := app.LoadConfig("", nil); err != nil {
		t.Errorf("got %v, want the variables accepted", err)
	}
}

// An OUTBOXD_* variable set to "" sets its key to the empty value, over
// the file, where the key may be empty (a key that cannot be is refused:
// TestErrorsNameTheKey). Not parallel: it sets OUTBOXD_* variables.
func TestEmptyVariableIsTheEmptyValue(t *testing.T) {
	t.Setenv("OUTBOXD_REDIS_KEY_PREFIX", "")
	t.Setenv("OUTBOXD_REDIS_PASSWORD", "")
	c, err := app.LoadConfig(writeFile(t, "redis:\n  key_prefix: \"billing:\"\n  password: from-file\n"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.Redis.KeyPrefix != "" || c.Redis.Password != "" {
		t.Errorf("redis.key_prefix %q, redis.password set: %v; want both empty, as the variables say", c.Redis.KeyPrefix, c.Redis.Password != "")
	}
}

// idempotency.store follows lock.backend when unset, and with both on
// Postgres redis.* is not checked: redis.addrs may be empty.
func TestIdempotencyStoreFollowsTheLease(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		sets []string
		want string
	}{
		{nil, config.IdempotencyRedis},
		{[]string{"lock.backend=postgres", "redis.addrs="}, config.IdempotencyPostgres},
		{[]string{"lock.backend=postgres", "idempotency.store=redis"}, config.IdempotencyRedis},
		{[]string{"idempotency.store=postgres"}, config.IdempotencyPostgres},
	} {
		c, err := app.LoadConfig("", tc.sets)
		if err != nil {
			t.Fatalf("%v: %v", tc.sets, err)
		}
		if c.Idempotency.Store != tc.want {
			t.Errorf("%v: idempotency.store %q, want %q", tc.sets, c.Idempotency.Store, tc.want)
		}
	}
}
