package sluiceotel_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/sluiceotel"
)

// throttleOnce answers its first call with a 429 and Retry-After: 2, and
// every other with 200, at once.
type throttleOnce struct{ n atomic.Int32 }

func (b *throttleOnce) RoundTrip(req *http.Request) (*http.Response, error) {
	if b.n.Add(1) == 1 {
		return &http.Response{StatusCode: 429, Header: http.Header{"Retry-After": {"2"}}, Body: http.NoBody, Request: req}, nil
	}
	return &http.Response{StatusCode: 200, Header: http.Header{}, Body: io.NopCloser(strings.NewReader("ok")), Request: req}, nil
}

// On virtual time, the span events are stamped when they happened, and the
// metrics read the cooldown as it runs.
func TestVirtualTimeline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		reader := sdkmetric.NewManualReader()
		mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
		spans := tracetest.NewSpanRecorder()
		tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
		tel, err := sluiceotel.New(sluiceotel.WithMeterProvider(mp))
		if err != nil {
			t.Fatal(err)
		}
		tr, err := sluice.New(&throttleOnce{}, sluice.WithRate(10, time.Second), sluice.WithObserver(tel))
		if err != nil {
			t.Fatal(err)
		}
		tel.Watch(tr)
		defer tr.Close()

		start := time.Now()
		ctx, span := tp.Tracer("test").Start(context.Background(), "call")
		done := make(chan struct{})
		go func() {
			defer close(done)
			req, _ := http.NewRequestWithContext(ctx, "GET", "http://api.example.com/x", nil)
			resp, err := tr.RoundTrip(req)
			if err != nil {
				t.Error(err)
				return
			}
			resp.Body.Close()
		}()
		time.Sleep(500 * time.Millisecond) // into the 2 s cooldown
		synctest.Wait()
		var rm metricdata.ResourceMetrics
		if err := reader.Collect(context.Background(), &rm); err != nil {
			t.Fatal(err)
		}
		lane := attribute.String("server.address", "api.example.com")
		if c, _ := point(t, rm, "sluice.cooldown.remaining", lane); c != 1.5 {
			t.Errorf("sluice.cooldown.remaining = %v s, 0.5 s into a 2 s cooldown", c)
		}
		<-done
		tr.WaitEvents(context.Background())
		span.End()

		if err := reader.Collect(context.Background(), &rm); err != nil {
			t.Fatal(err)
		}
		_, h := point(t, rm, "sluice.wait", lane, attribute.String("sluice.priority", "normal"))
		if h.Count != 2 || h.Sum != 2 {
			t.Errorf("sluice.wait: %d samples summing %v s, want 2 (no wait, then the 2 s cooldown)", h.Count, h.Sum)
		}
		if c, _ := point(t, rm, "sluice.cooldown.remaining", lane); c != 0 {
			t.Errorf("sluice.cooldown.remaining = %v s after the cooldown", c)
		}

		at := make(map[string][]time.Duration)
		for _, e := range spans.Ended()[0].Events() {
			at[e.Name] = append(at[e.Name], e.Time.Sub(start))
		}
		for name, want := range map[string][]time.Duration{
			sluiceotel.EventGranted:   {0, 2 * time.Second},
			sluiceotel.EventThrottled: {0},
			sluiceotel.EventCooldown:  {0},
			sluiceotel.EventRetry:     {0},
		} {
			if got := at[name]; len(got) != len(want) || got[0] != want[0] || got[len(got)-1] != want[len(want)-1] {
				t.Errorf("%s at %v, want %v", name, got, want)
			}
		}
	})
}

// overloaded answers every call with Anthropic's 529 overloaded_error.
type overloaded struct{}

func (overloaded) RoundTrip(req *http.Request) (*http.Response, error) {
	return &http.Response{StatusCode: 529, Header: http.Header{}, Request: req,
		Body: io.NopCloser(strings.NewReader(`{"type":"error","error":{"type":"overloaded_error"}}`))}, nil
}

// An overload is a sluice.overloaded span event with its status, cause and
// the in-flight limit it left.
func TestOverloadedSpanEvent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		spans := tracetest.NewSpanRecorder()
		tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
		tel, err := sluiceotel.New()
		if err != nil {
			t.Fatal(err)
		}
		tr, err := sluice.New(overloaded{}, sluice.WithRate(10, time.Second), sluice.WithConcurrency(1, 16),
			sluice.WithRetry(0), sluice.WithObserver(tel))
		if err != nil {
			t.Fatal(err)
		}
		tel.Watch(tr)
		defer tr.Close()
		ctx, span := tp.Tracer("test").Start(context.Background(), "call")
		req, _ := http.NewRequestWithContext(ctx, "GET", "http://api.example.com/x", nil)
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		tr.WaitEvents(context.Background())
		span.End()
		var got []sdktrace.Event
		for _, e := range spans.Ended()[0].Events() {
			if e.Name == sluiceotel.EventOverloaded {
				got = append(got, e)
			}
		}
		if len(got) != 1 {
			t.Fatalf("%d overloaded events, want 1", len(got))
		}
		attrs := attribute.NewSet(got[0].Attributes...)
		status, _ := attrs.Value("http.response.status_code")
		cause, _ := attrs.Value(sluiceotel.CauseKey)
		limit, _ := attrs.Value(sluiceotel.LimitKey)
		ls, _ := tr.LaneStats("api.example.com")
		if status.AsInt64() != 529 || cause.AsString() != sluice.OverloadStatus || limit.AsInt64() != int64(ls.Limit) || ls.Limit >= 16 {
			t.Errorf("overloaded event %v, want status 529, cause %q, the limit cut from 16 to the lane's %d",
				got[0].Attributes, sluice.OverloadStatus, ls.Limit)
		}
	})
}
