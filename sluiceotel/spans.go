package sluiceotel

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluice-go/sluice"
)

// Span event names.
const (
	EventQueued      = "sluice.queued"
	EventGranted     = "sluice.granted"
	EventRefused     = "sluice.refused"
	EventRetry       = "sluice.retry"
	EventThrottled   = "sluice.throttled"
	EventCooldown    = "sluice.cooldown"
	EventRateChanged = "sluice.rate_changed"
	EventOverloaded  = "sluice.overloaded"
)

// spanEvent adds e to the span in ctx, if it records, at the time e
// happened: events reach an Observer a few microseconds late.
func spanEvent(ctx context.Context, e sluice.Event) {
	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() {
		return
	}
	var name string
	var kv []attribute.KeyValue
	switch e.Kind {
	case sluice.EventQueued:
		name = EventQueued
		kv = []attribute.KeyValue{QueuedKey.Int(e.Queued)}
		if e.Attempt > 0 { // sluice does not say which attempt queued
			kv = append(kv, AttemptKey.Int(e.Attempt))
		}
	case sluice.EventGranted:
		name = EventGranted
		kv = []attribute.KeyValue{AttemptKey.Int(e.Attempt), WaitKey.Float64(e.Wait.Seconds())}
	case sluice.EventRefused:
		// The estimated wait that was too long.
		name = EventRefused
		kv = []attribute.KeyValue{AttemptKey.Int(e.Attempt), semconv.ErrorTypeKey.String(e.Reason.String()), WaitKey.Float64(e.Wait.Seconds())}
	case sluice.EventRetried:
		name = EventRetry
		kv = []attribute.KeyValue{semconv.HTTPRequestResendCount(e.Attempt - 1), WaitKey.Float64(e.Wait.Seconds())}
		if e.Status != 0 {
			kv = append(kv, semconv.HTTPResponseStatusCode(e.Status))
		} else if e.Err != nil {
			kv = append(kv, semconv.ErrorType(e.Err))
		}
	case sluice.EventThrottled:
		name = EventThrottled
		kv = []attribute.KeyValue{semconv.HTTPResponseStatusCode(e.Status)}
	case sluice.EventCooldown:
		name = EventCooldown
		kv = []attribute.KeyValue{CauseKey.String(e.Cause), WaitKey.Float64(e.Wait.Seconds())}
	case sluice.EventRateChanged:
		name = EventRateChanged
		kv = []attribute.KeyValue{CauseKey.String(e.Cause), RateFromKey.Float64(e.From), RateToKey.Float64(e.To)}
	case sluice.EventOverloaded:
		name = EventOverloaded
		kv = []attribute.KeyValue{CauseKey.String(e.Cause), LimitKey.Int(int(e.To)), WaitKey.Float64(e.Wait.Seconds())}
		if e.Status != 0 {
			kv = append(kv, semconv.HTTPResponseStatusCode(e.Status))
		}
	default:
		return
	}
	span.AddEvent(name, trace.WithTimestamp(e.Time), trace.WithAttributes(kv...))
}
