package app

import (
	"cmp"
	"context"
	"errors"
	"net/url"
	"time"

	"go.opentelemetry.io/otel/attribute"
	semconv "go.opentelemetry.io/otel/semconv/v1.39.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxd/outboxd/config"
	"github.com/outboxd/outboxd/dispatch"
	"github.com/outboxd/outboxd/dispatch/traced"
	"github.com/outboxd/outboxd/internal/tracing"
)

// startTracing builds the tracer provider the OTEL_* environment asks for
// (a no-op one when it asks for none) and returns its shutdown, which
// flushes the spans not yet exported. A value it cannot use is a
// *config.KeyError naming the variable (exit 2).
func (a *App) startTracing(ctx context.Context) (stop func(), err error) {
	tp, err := tracing.FromEnv(ctx, a.Log)
	var ee *tracing.EnvError
	if errors.As(err, &ee) {
		return nil, &config.KeyError{Key: ee.Var, Err: ee.Err}
	}
	if err != nil {
		return nil, err
	}
	a.tracing = tp
	if tp.Enabled {
		a.Log.Info("tracing on", "service", tp.Service)
	}
	return func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := tp.Shutdown(sctx); err != nil {
			a.Log.Warn("trace export failed", "error", err)
		}
	}, nil
}

// traced wraps destination d's sink s in per-event send spans when tracing
// is on (dispatch/traced), described by d's settings; off, s as it is.
func (a *App) traced(d destination, s dispatch.Sink) dispatch.Sink {
	if a.tracing == nil || !a.tracing.Enabled {
		return s
	}
	o := traced.Options{System: d.d.Sink}
	if k, err := sinkOf(d); err == nil && k.template != nil {
		if t, err := dispatch.ParseTemplate(k.template(d.d)); err == nil {
			o.Template, o.Destination = k.template(d.d), t.Expand
		}
	}
	switch d.d.Sink {
	case "kafka":
		o.Attributes = func(ev dispatch.Event) []attribute.KeyValue {
			return []attribute.KeyValue{semconv.MessagingKafkaMessageKey(ev.AggregateID)} // the record key
		}
	case "rabbitmq":
		// The exchange is the destination; the templated routing key its attribute.
		rk := o.Destination
		exchange := cmp.Or(d.d.RabbitMQ.Exchange, "amq.default")
		o.Template, o.Destination = "", func(dispatch.Event) string { return exchange }
		if rk != nil {
			o.Attributes = func(ev dispatch.Event) []attribute.KeyValue {
				return []attribute.KeyValue{semconv.MessagingRabbitMQDestinationRoutingKey(rk(ev))}
			}
		}
	case "redis_stream":
		o.System = "redis"
	case "pubsub", "sqs", "sns":
		// The semantic conventions' names for the cloud queues.
		o.System = map[string]string{"pubsub": semconv.MessagingSystemGCPPubSub.Value.AsString(),
			"sqs": semconv.MessagingSystemAWSSQS.Value.AsString(), "sns": semconv.MessagingSystemAWSSNS.Value.AsString()}[d.d.Sink]
	case "webhook":
		// Host and path only: the URL's credentials and query stay out of spans.
		if u, err := url.Parse(d.d.Webhook.URL); err == nil {
			dest := u.Host + u.Path
			o.Destination = func(dispatch.Event) string { return dest }
		}
	}
	return traced.Wrap(s, a.tracing, o)
}

// tracerProvider is the poller's: none before startTracing.
func (a *App) tracerProvider() trace.TracerProvider {
	if a.tracing == nil {
		return nil
	}
	return a.tracing
}
