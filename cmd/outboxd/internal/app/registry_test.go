package app

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/outboxd/outboxd/config"
)

// The registry is the one list of sinks: its names are the contract's, each
// section and template key is a configuration key, and a bad template is
// refused naming the key of the destination's own section.
func TestSinkRegistry(t *testing.T) {
	t.Parallel()
	var names []string
	for name := range sinks {
		names = append(names, name)
	}
	slices.Sort(names)
	if want := []string{"kafka", "kinesis", "nats", "noop", "pubsub", "rabbitmq", "redis_stream", "sns", "sqs", "webhook"}; !slices.Equal(names, want) {
		t.Fatalf("sinks %v, want %v", names, want)
	}
	keys := config.Keys()
	for name, k := range sinks {
		if k.build == nil {
			t.Errorf("%s: no build", name)
		}
		if k.section != "" && !slices.ContainsFunc(keys, func(key string) bool { return strings.HasPrefix(key, "dispatch."+k.section+".") }) {
			t.Errorf("%s: section dispatch.%s has no configuration key", name, k.section)
		}
		if k.templateKey == "" {
			continue
		}
		key := "dispatch." + k.section + "." + k.templateKey
		if !slices.Contains(keys, key) {
			t.Errorf("%s: template key %s is not a configuration key", name, key)
		}
		sets := []string{"dispatch.sink=" + name, key + "=outbox.{nope}", "dispatch.kafka.brokers=b:9092"}
		_, err := LoadConfig("", sets)
		var ke *config.KeyError
		if !errors.As(err, &ke) || ke.Key != key {
			t.Errorf("%v: got %v, want an error naming %s", sets, err, key)
		}
	}
	_, err := LoadConfig("", []string{"dispatch.sink=carrier-pigeon"})
	if err == nil || !strings.Contains(err.Error(), "dispatch.sink") || !strings.Contains(err.Error(), "kafka, kinesis, nats, noop, pubsub, rabbitmq, redis_stream, sns, sqs, webhook") {
		t.Errorf("unknown sink: %v, want dispatch.sink named with the registry's names", err)
	}
}

// Kafka's broker and SASL rules are the sink's own (kafka.CheckBrokers,
// kafka.CheckSASL), applied once: the mechanism in any case, a username
// with it, brokers as host:port.
func TestKafkaSettingsAreCheckedByTheSinksRules(t *testing.T) {
	t.Parallel()
	base := []string{"dispatch.sink=kafka", "dispatch.kafka.brokers=b:9092"}
	for _, tc := range []struct {
		sets []string
		key  string // "" = valid
	}{
		{[]string{"dispatch.kafka.sasl.mechanism=scram-sha-512", "dispatch.kafka.sasl.username=u"}, ""},
		{[]string{"dispatch.kafka.sasl.mechanism=PLAIN"}, "dispatch.kafka.sasl.username"},
		{[]string{"dispatch.kafka.sasl.mechanism=GSSAPI", "dispatch.kafka.sasl.username=u"}, "dispatch.kafka.sasl.mechanism"},
		{[]string{"dispatch.kafka.brokers=kafka://u:p@b:9092"}, "dispatch.kafka.brokers"},
		{[]string{"dispatch.kafka.tls.ca_file=/nonexistent"}, "dispatch.kafka.tls.ca_file"},
	} {
		_, err := LoadConfig("", append(slices.Clone(base), tc.sets...))
		var ke *config.KeyError
		switch {
		case tc.key == "" && err != nil:
			t.Errorf("%v: %v", tc.sets, err)
		case tc.key != "" && (!errors.As(err, &ke) || ke.Key != tc.key):
			t.Errorf("%v: got %v, want an error naming %s", tc.sets, err, tc.key)
		}
	}
}
