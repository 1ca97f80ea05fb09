package app

import (
	"errors"
	"log/slog"
	"slices"
	"testing"

	"github.com/outboxd/outboxd/config"
)

// The Pub/Sub and Kinesis settings are checked by the sinks' own rules at
// load, each error naming its key; Kinesis' region, which the AWS chain
// may supply, is checked when the sink is built.
func TestCloudSinkSettingsAreChecked(t *testing.T) {
	t.Setenv("AWS_REGION", "")
	t.Setenv("AWS_DEFAULT_REGION", "")
	t.Setenv("AWS_CONFIG_FILE", "/nonexistent")
	t.Setenv("PUBSUB_EMULATOR_HOST", "")
	pubsub := []string{"dispatch.sink=pubsub", "dispatch.pubsub.project=p"}
	kinesis := []string{"dispatch.sink=kinesis", "dispatch.kinesis.region=eu-west-1"}
	for _, tc := range []struct {
		sets []string
		key  string // "" = valid
	}{
		{pubsub, ""},
		{append(slices.Clone(pubsub), "dispatch.pubsub.endpoint=http://127.0.0.1:8085"), ""},
		{append(slices.Clone(pubsub), "dispatch.pubsub.endpoint=https://europe-west1-pubsub.googleapis.com"), ""},
		{[]string{"dispatch.sink=pubsub"}, "dispatch.pubsub.project"},
		{append(slices.Clone(pubsub), "dispatch.pubsub.endpoint=127.0.0.1:8085"), "dispatch.pubsub.endpoint"},
		{append(slices.Clone(pubsub), "dispatch.pubsub.topic=goog.{aggregate_type}"), "dispatch.pubsub.topic"},
		{append(slices.Clone(pubsub), "dispatch.pubsub.topic=outbox/{aggregate_type}"), "dispatch.pubsub.topic"},
		{kinesis, ""},
		{append(slices.Clone(kinesis), "dispatch.kinesis.endpoint=127.0.0.1:4567"), "dispatch.kinesis.endpoint"},
		{append(slices.Clone(kinesis), "dispatch.kinesis.stream=outbox:{aggregate_type}"), "dispatch.kinesis.stream"},
	} {
		_, err := LoadConfig("", tc.sets)
		var ke *config.KeyError
		switch {
		case tc.key == "" && err != nil:
			t.Errorf("%v: %v", tc.sets, err)
		case tc.key != "" && (!errors.As(err, &ke) || ke.Key != tc.key):
			t.Errorf("%v: got %v, want an error naming %s", tc.sets, err, tc.key)
		}
	}

	cfg, err := LoadConfig("", []string{"dispatch.sink=kinesis"})
	if err != nil {
		t.Fatal(err)
	}
	a := &App{Cfg: cfg, Log: slog.New(slog.DiscardHandler)}
	_, err = a.Sink()
	var ke *config.KeyError
	if !errors.As(err, &ke) || ke.Key != "dispatch.kinesis.region" {
		t.Errorf("no region anywhere: %v, want an error naming dispatch.kinesis.region", err)
	}
}
