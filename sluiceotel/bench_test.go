package sluiceotel_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/sluiceotel"
)

type nopBase struct{}

func (nopBase) RoundTrip(req *http.Request) (*http.Response, error) {
	return &http.Response{StatusCode: 200, Body: http.NoBody, Request: req}, nil
}

func newTelemetry(b *testing.B) *sluiceotel.Telemetry {
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	b.Cleanup(func() { mp.Shutdown(context.Background()) })
	tel, err := sluiceotel.New(sluiceotel.WithMeterProvider(mp))
	if err != nil {
		b.Fatal(err)
	}
	return tel
}

// spanContext returns a context with a recording span of the SDK, whose
// events the benchmarks add to (past its event limit the SDK counts them
// and drops them, as it would in a long request).
func spanContext(b *testing.B) context.Context {
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(tracetest.NewSpanRecorder()))
	b.Cleanup(func() { tp.Shutdown(context.Background()) })
	ctx, span := tp.Tracer("bench").Start(context.Background(), "request")
	b.Cleanup(func() { span.End() })
	return ctx
}

// BenchmarkRoundTrip measures what a Telemetry as Observer adds to sluice's
// fast path (token and slot free, nobody waiting), beside no Observer and
// an Observer that does nothing; "+span" sends the requests with a
// recording span in their context, so each gets a span event too. The
// Observer runs on the Transport's event goroutine: what the request pays
// is the event's hand-off, and the Observer's own work shows where that
// goroutine competes for the cores (the parallel runs) or falls behind
// (dropped/op).
func BenchmarkRoundTrip(b *testing.B) {
	plain, _ := http.NewRequest("GET", "http://api.test/", nil)
	spanned := plain.WithContext(spanContext(b))
	mk := func(opts ...sluice.Option) *sluice.Transport {
		tr, err := sluice.New(nopBase{}, append([]sluice.Option{sluice.WithRate(1e9, time.Second), sluice.WithBurst(1 << 30)}, opts...)...)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { tr.Close() })
		return tr
	}
	tel := newTelemetry(b)
	otr := mk(sluice.WithObserver(tel))
	tel.Watch(otr)
	variants := []struct {
		name string
		tr   *sluice.Transport
		req  *http.Request
	}{
		{"sluice", mk(), plain},
		{"sluice+nop-observer", mk(sluice.WithObserver(sluice.ObserverFunc(func(context.Context, sluice.Event) {}))), plain},
		{"sluice+sluiceotel", otr, plain},
		{"sluice+sluiceotel+span", otr, spanned},
	}
	for _, v := range variants {
		run := func(b *testing.B) {
			resp, err := v.tr.RoundTrip(v.req)
			if err != nil {
				b.Fatal(err)
			}
			resp.Body.Close()
		}
		dropped := func(b *testing.B, from uint64) {
			v.tr.WaitEvents(context.Background())
			b.ReportMetric(float64(v.tr.Stats().EventsDropped-from)/float64(b.N), "dropped/op")
		}
		b.Run(v.name, func(b *testing.B) {
			b.ReportAllocs()
			from := v.tr.Stats().EventsDropped
			for b.Loop() {
				run(b)
			}
			dropped(b, from)
		})
		b.Run(v.name+"/parallel", func(b *testing.B) {
			b.ReportAllocs()
			from := v.tr.Stats().EventsDropped
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					run(b)
				}
			})
			dropped(b, from)
		})
	}
}

// BenchmarkObserve measures a Telemetry's Observer alone, per granted
// event: the work the Transport's event goroutine does for it, without a
// span in the context and with one.
func BenchmarkObserve(b *testing.B) {
	tel := newTelemetry(b)
	e := sluice.Event{Kind: sluice.EventGranted, Time: time.Now(), Lane: "api.test", Priority: sluice.Normal, Attempt: 1, Wait: 3 * time.Millisecond}
	for _, c := range []struct {
		name string
		ctx  context.Context
	}{{"metrics", context.Background()}, {"metrics+span", spanContext(b)}} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				tel.Observe(c.ctx, e)
			}
		})
	}
}
