package sluiceotel_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.uber.org/goleak"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/sluiceotel"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// upstream answers 200, except its second call: a 429 with Retry-After 1.
func upstream(t *testing.T) *httptest.Server {
	var calls atomic.Int32
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) == 2 {
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusTooManyRequests)
			return
		}
		fmt.Fprint(w, "ok")
	}))
	t.Cleanup(s.Close)
	return s
}

type setup struct {
	tr     *sluice.Transport
	tel    *sluiceotel.Telemetry
	reader *sdkmetric.ManualReader
	spans  *tracetest.SpanRecorder
	client *http.Client
}

func newSetup(t *testing.T, opts ...sluiceotel.Option) *setup {
	t.Helper()
	s := &setup{reader: sdkmetric.NewManualReader(), spans: tracetest.NewSpanRecorder()}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(s.reader))
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(s.spans))
	var err error
	s.tel, err = sluiceotel.New(append([]sluiceotel.Option{sluiceotel.WithMeterProvider(mp)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	s.tr, err = sluice.New(nil, sluice.WithRate(50, time.Second), sluice.WithMaxWait(sluice.Batch, 100*time.Millisecond),
		sluice.WithObserver(s.tel))
	if err != nil {
		t.Fatal(err)
	}
	s.tel.Watch(s.tr)
	s.client = &http.Client{Transport: otelhttp.NewTransport(s.tr, otelhttp.WithTracerProvider(tp))}
	t.Cleanup(func() {
		s.tel.Close()
		s.tr.Close()
		s.tr.CloseIdleConnections()
		mp.Shutdown(context.Background())
		tp.Shutdown(context.Background())
	})
	return s
}

// get sends a request through otelhttp and sluice, and waits for its events
// before closing the body, which ends otelhttp's span.
func (s *setup) get(ctx context.Context, url string) error {
	req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
	resp, err := s.client.Do(req)
	if err != nil {
		return err
	}
	s.tr.WaitEvents(ctx)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		return fmt.Errorf("status %d", resp.StatusCode)
	}
	return nil
}

// traffic: a normal request; one that gets the 429, cools the lane down and
// is retried; while the lane cools down, a batch request that WithMaxWait
// refuses; then an interactive one.
func (s *setup) traffic(t *testing.T, url, key string) {
	t.Helper()
	ctx := context.Background()
	if err := s.get(ctx, url); err != nil {
		t.Fatal(err)
	}
	done := make(chan error)
	go func() { done <- s.get(ctx, url) }()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		if ls, _ := s.tr.LaneStats(key); !ls.Cooldown.IsZero() {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the 429 did not cool the lane down")
		}
	}
	if err := s.get(sluice.WithPriority(ctx, sluice.Batch), url); !errors.Is(err, sluice.ErrRejected) {
		t.Fatalf("batch request during the cooldown: %v, want a refusal", err)
	}
	if err := <-done; err != nil {
		t.Fatalf("the throttled request, retried: %v", err)
	}
	if err := s.get(sluice.WithPriority(ctx, sluice.Interactive), url); err != nil {
		t.Fatal(err)
	}
	if err := s.tr.WaitEvents(ctx); err != nil {
		t.Fatal(err)
	}
}

// point finds the data point of metric name whose attributes are exactly
// kv.
func point(t *testing.T, rm metricdata.ResourceMetrics, name string, kv ...attribute.KeyValue) (float64, metricdata.HistogramDataPoint[float64]) {
	t.Helper()
	want := attribute.NewSet(kv...)
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != name {
				continue
			}
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					if p.Attributes.Equals(&want) {
						return float64(p.Value), metricdata.HistogramDataPoint[float64]{}
					}
				}
			case metricdata.Gauge[int64]:
				for _, p := range d.DataPoints {
					if p.Attributes.Equals(&want) {
						return float64(p.Value), metricdata.HistogramDataPoint[float64]{}
					}
				}
			case metricdata.Gauge[float64]:
				for _, p := range d.DataPoints {
					if p.Attributes.Equals(&want) {
						return p.Value, metricdata.HistogramDataPoint[float64]{}
					}
				}
			case metricdata.Histogram[float64]:
				for _, p := range d.DataPoints {
					if p.Attributes.Equals(&want) {
						return 0, p
					}
				}
			}
		}
	}
	t.Fatalf("no %s %v collected", name, kv)
	return 0, metricdata.HistogramDataPoint[float64]{}
}

func hostPort(t *testing.T, url string) (string, int, []attribute.KeyValue) {
	host, port, _ := strings.Cut(strings.TrimPrefix(url, "http://"), ":")
	n, err := strconv.Atoi(port)
	if err != nil {
		t.Fatal(err)
	}
	return host, n, []attribute.KeyValue{attribute.String("server.address", host), attribute.Int("server.port", n)}
}

func TestMetricsMatchStats(t *testing.T) {
	s := newSetup(t)
	up := upstream(t)
	key := strings.TrimPrefix(up.URL, "http://")
	_, _, lane := hostPort(t, up.URL)
	s.traffic(t, up.URL, key)

	var rm metricdata.ResourceMetrics
	if err := s.reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	st, _ := s.tr.LaneStats(key)
	at := func(p sluice.Priority, more ...attribute.KeyValue) []attribute.KeyValue {
		return append(append(append([]attribute.KeyValue(nil), lane...), attribute.String("sluice.priority", p.String())), more...)
	}
	val := func(name string, kv ...attribute.KeyValue) float64 {
		v, _ := point(t, rm, name, kv...)
		return v
	}
	// What the traffic did, independent of Stats.
	for _, c := range []struct {
		name string
		got  float64
		want float64
	}{
		{"retries", val("sluice.retries", lane...), 1},
		{"cooldowns", val("sluice.cooldowns", lane...), 1},
		{"lanes", val("sluice.lanes", lane...), 1},
		{"granted normal", val("sluice.granted", at(sluice.Normal)...), 3},
		{"granted interactive", val("sluice.granted", at(sluice.Interactive)...), 1},
		{"throttled normal", val("sluice.throttled", at(sluice.Normal)...), 1},
		{"refused batch max-wait", val("sluice.refused", at(sluice.Batch, attribute.String("error.type", "max-wait"))...), 1},
		// Against Stats.
		{"ceiling", val("sluice.rate.ceiling", lane...), st.Ceiling},
		{"limit", val("sluice.in_flight.limit", lane...), float64(st.Limit)},
		{"in flight", val("sluice.in_flight", lane...), float64(st.InFlight)},
		{"latency", val("sluice.latency", lane...), st.Latency.Seconds()},
		{"baseline", val("sluice.latency.baseline", lane...), st.Baseline.Seconds()},
		{"retries denied", val("sluice.retries.denied", lane...), float64(st.RetriesDenied)},
		{"events dropped", val("sluice.events.dropped"), float64(s.tr.Stats().EventsDropped)},
	} {
		if c.got != c.want {
			t.Errorf("%s = %v, want %v", c.name, c.got, c.want)
		}
	}
	for p := sluice.Interactive; p <= sluice.Batch; p++ {
		lv := st.Levels[p]
		if g := val("sluice.granted", at(p)...); g != float64(lv.Granted) {
			t.Errorf("granted %s = %v, Stats says %d", p, g, lv.Granted)
		}
		if q := val("sluice.queue.size", at(p)...); q != float64(lv.Queued) {
			t.Errorf("queued %s = %v, Stats says %d", p, q, lv.Queued)
		}
		for r := range lv.Refused {
			reason := sluice.Reason(r).String()
			if n := val("sluice.refused", at(p, attribute.String("error.type", reason))...); n != float64(lv.Refused[r]) {
				t.Errorf("refused %s %s = %v, Stats says %d", p, reason, n, lv.Refused[r])
			}
		}
		if lv.Granted == 0 {
			continue
		}
		_, h := point(t, rm, "sluice.wait", at(p)...)
		if h.Count != lv.Granted {
			t.Errorf("sluice.wait count %s = %d, Stats granted %d", p, h.Count, lv.Granted)
		}
	}
	// The package doc's count: 45 series per lane besides the histogram.
	series := 0
	hasLane := func(set attribute.Set) bool {
		v, ok := set.Value("server.address")
		return ok && v == lane[0].Value
	}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					if hasLane(p.Attributes) {
						series++
					}
				}
			case metricdata.Gauge[int64]:
				for _, p := range d.DataPoints {
					if hasLane(p.Attributes) {
						series++
					}
				}
			case metricdata.Gauge[float64]:
				for _, p := range d.DataPoints {
					if hasLane(p.Attributes) {
						series++
					}
				}
			}
		}
	}
	if series != 45 {
		t.Errorf("%d series for one lane besides the histogram, the doc says 45", series)
	}
	// The retry waited for the 1 s cooldown.
	if _, h := point(t, rm, "sluice.wait", at(sluice.Normal)...); h.Sum < 0.5 {
		t.Errorf("sluice.wait sum %v s, want the retry's wait for the cooldown in it", h.Sum)
	}
}

func TestSpanEvents(t *testing.T) {
	s := newSetup(t)
	up := upstream(t)
	key := strings.TrimPrefix(up.URL, "http://")
	s.traffic(t, up.URL, key)

	spans := s.spans.Ended()
	if len(spans) != 4 {
		t.Fatalf("%d spans ended, want 4", len(spans))
	}
	names := func(sp sdktrace.ReadOnlySpan) []string {
		var n []string
		for _, e := range sp.Events() {
			n = append(n, e.Name)
		}
		return n
	}
	// The throttled request's span.
	var thr sdktrace.ReadOnlySpan
	for _, sp := range spans {
		if strings.Contains(strings.Join(names(sp), " "), sluiceotel.EventThrottled) {
			thr = sp
		}
	}
	if thr == nil {
		t.Fatalf("no span with a throttled event: %v", spans)
	}
	// In this order, with others (queued, rate_changed) between them.
	ev := thr.Events()
	var seq []sdktrace.Event
	want := []string{"sluice.granted", "sluice.throttled", "sluice.cooldown", "sluice.retry", "sluice.granted"}
	for _, e := range ev {
		if len(seq) < len(want) && e.Name == want[len(seq)] {
			seq = append(seq, e)
		}
	}
	if len(seq) != len(want) {
		t.Fatalf("events %v, want %v among them in order", names(thr), want)
	}
	attr := func(e sdktrace.Event, k string) attribute.Value {
		for _, kv := range e.Attributes {
			if string(kv.Key) == k {
				return kv.Value
			}
		}
		t.Errorf("event %s has no %s: %v", e.Name, k, e.Attributes)
		return attribute.Value{}
	}
	if c := attr(seq[1], "http.response.status_code").AsInt64(); c != 429 {
		t.Errorf("throttled status %d", c)
	}
	if c := attr(seq[2], "sluice.cause").AsString(); c != "retry-after" {
		t.Errorf("cooldown cause %q", c)
	}
	if n := attr(seq[3], "http.request.resend_count").AsInt64(); n != 1 {
		t.Errorf("retry resend count %d", n)
	}
	last := seq[4]
	wait := attr(last, "sluice.wait_time").AsFloat64()
	if wait < 0.5 {
		t.Errorf("the retry's grant waited %v s, want about the 1 s cooldown", wait)
	}
	// Stamped when they happened: in order, within the span, and the
	// retry's grant about its wait after the 429.
	for i, e := range ev {
		if e.Time.Before(thr.StartTime()) || e.Time.After(thr.EndTime()) {
			t.Errorf("event %s at %v, outside its span %v..%v", e.Name, e.Time, thr.StartTime(), thr.EndTime())
		}
		if i > 0 && e.Time.Before(ev[i-1].Time) {
			t.Errorf("event %s before the one ahead of it", e.Name)
		}
	}
	if gap := last.Time.Sub(seq[1].Time).Seconds(); gap < wait*0.9 {
		t.Errorf("the grant came %v s after the 429, but says it waited %v s", gap, wait)
	}

	// The refused request's span ended at once on the error, which names
	// the reason.
	var refused int
	for _, sp := range spans {
		if sp.Status().Code == codes.Error {
			refused++
			if !strings.Contains(sp.Status().Description, "max-wait") {
				t.Errorf("refused span status %q, want the reason in it", sp.Status().Description)
			}
		}
	}
	if refused != 1 {
		t.Errorf("%d spans with an error, want the 1 refused", refused)
	}
}

// A lane name that is no host is attributed sluice.lane; past the cap,
// lanes go under "other".
func TestLaneNames(t *testing.T) {
	a, b := upstream(t), upstream(t)
	_, _, bLane := hostPort(t, b.URL)
	s := newSetup(t, sluiceotel.WithMaxLanes(2), sluiceotel.WithLaneLabel(func(key string) string {
		if key == strings.TrimPrefix(a.URL, "http://") {
			return "api-a"
		}
		return key
	}))
	ctx := context.Background()
	c := upstream(t)
	for _, u := range []string{a.URL, b.URL, c.URL} {
		if err := s.get(ctx, u); err != nil {
			t.Fatal(err)
		}
	}
	var rm metricdata.ResourceMetrics
	if err := s.reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	for _, lane := range [][]attribute.KeyValue{
		{attribute.String("sluice.lane", "api-a")},
		bLane,
		{attribute.String("sluice.lane", "other")},
	} {
		if n, _ := point(t, rm, "sluice.lanes", lane...); n != 1 {
			t.Errorf("sluice.lanes %v = %v, want 1", lane, n)
		}
		if _, h := point(t, rm, "sluice.wait", append(lane, attribute.String("sluice.priority", "normal"))...); h.Count != 1 {
			t.Errorf("sluice.wait %v count %d, want 1", lane, h.Count)
		}
	}
}

func TestOptionsValidated(t *testing.T) {
	for _, c := range []struct {
		opt  sluiceotel.Option
		want string
	}{
		{sluiceotel.WithMeterProvider(nil), "sluiceotel: WithMeterProvider(nil)"},
		{sluiceotel.WithLaneLabel(nil), "sluiceotel: WithLaneLabel(nil)"},
		{sluiceotel.WithMaxLanes(-3), "sluiceotel: WithMaxLanes(-3)"},
	} {
		if _, err := sluiceotel.New(c.opt); err == nil || !strings.HasPrefix(err.Error(), c.want) {
			t.Errorf("New: %v, want an error starting %q", err, c.want)
		}
	}
}
