package sluiceprom_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/goleak"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/sluiceprom"
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

func newTransport(t *testing.T, m *sluiceprom.Metrics, opts ...sluice.Option) *sluice.Transport {
	t.Helper()
	opts = append([]sluice.Option{sluice.WithRate(50, time.Second), sluice.WithObserver(m)}, opts...)
	tr, err := sluice.New(nil, opts...)
	if err != nil {
		t.Fatal(err)
	}
	m.Watch(tr)
	t.Cleanup(func() { tr.Close(); tr.CloseIdleConnections() })
	return tr
}

func get(ctx context.Context, tr *sluice.Transport, url string) error {
	req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
	resp, err := tr.RoundTrip(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		return fmt.Errorf("status %d", resp.StatusCode)
	}
	return nil
}

// traffic sends, to the upstream's lane: a normal request; one that gets
// the 429, cools the lane down and is retried; while the lane cools down, a
// batch request that WithMaxWait refuses; then another normal one and an
// interactive one.
func traffic(t *testing.T, tr *sluice.Transport, url, key string) {
	t.Helper()
	ctx := context.Background()
	if err := get(ctx, tr, url); err != nil {
		t.Fatal(err)
	}
	done := make(chan error)
	go func() { done <- get(ctx, tr, url) }()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		if ls, _ := tr.LaneStats(key); !ls.Cooldown.IsZero() {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the 429 did not cool the lane down")
		}
	}
	if err := get(sluice.WithPriority(ctx, sluice.Batch), tr, url); !errors.Is(err, sluice.ErrRejected) {
		t.Fatalf("batch request during the cooldown: %v, want a refusal", err)
	}
	if err := <-done; err != nil {
		t.Fatalf("the throttled request, retried: %v", err)
	}
	if err := get(ctx, tr, url); err != nil {
		t.Fatal(err)
	}
	if err := get(sluice.WithPriority(ctx, sluice.Interactive), tr, url); err != nil {
		t.Fatal(err)
	}
	if err := tr.WaitEvents(ctx); err != nil {
		t.Fatal(err)
	}
}

// metric returns the value of the metric of family name whose labels are
// exactly labels, and whether there is one.
func metric(fams []*dto.MetricFamily, name string, labels ...string) (*dto.Metric, bool) {
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
	next:
		for _, m := range f.Metric {
			if len(m.Label)*2 != len(labels) {
				continue
			}
			for i, lp := range m.Label {
				if lp.GetName() != labels[2*i] || lp.GetValue() != labels[2*i+1] {
					continue next
				}
			}
			return m, true
		}
	}
	return nil, false
}

func value(t *testing.T, fams []*dto.MetricFamily, name string, labels ...string) float64 {
	t.Helper()
	m, ok := metric(fams, name, labels...)
	if !ok {
		t.Fatalf("no %s%v scraped", name, labels)
	}
	switch {
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	case m.Counter != nil:
		return m.Counter.GetValue()
	}
	t.Fatalf("%s%v is neither gauge nor counter", name, labels)
	return 0
}

func TestScrapeMatchesStats(t *testing.T) {
	m, err := sluiceprom.New()
	if err != nil {
		t.Fatal(err)
	}
	up := upstream(t)
	key := strings.TrimPrefix(up.URL, "http://")
	tr := newTransport(t, m, sluice.WithMaxWait(sluice.Batch, 100*time.Millisecond))
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(m)
	traffic(t, tr, up.URL, key)

	before, _ := tr.LaneStats(key)
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	after, _ := tr.LaneStats(key)

	// What the traffic did, independent of Stats.
	want := map[string]float64{
		"sluice_retries_total":   1,
		"sluice_cooldowns_total": 1,
		"sluice_lanes":           1,
	}
	for name, v := range want {
		if got := value(t, fams, name, "lane", key); got != v {
			t.Errorf("%s = %v, want %v", name, got, v)
		}
	}
	lv := func(name string, p sluice.Priority) float64 {
		return value(t, fams, name, "lane", key, "priority", p.String())
	}
	if g := lv("sluice_granted_total", sluice.Normal); g != 4 {
		t.Errorf("granted{normal} = %v, want 4 (2 requests, the throttled one and its retry)", g)
	}
	if g := lv("sluice_throttled_total", sluice.Normal); g != 1 {
		t.Errorf("throttled{normal} = %v, want 1", g)
	}
	if r := value(t, fams, "sluice_refused_total", "lane", key, "priority", "batch", "reason", "max-wait"); r != 1 {
		t.Errorf("refused{batch,max-wait} = %v, want 1", r)
	}

	// Every figure against Stats.
	eq := func(name string, got, want float64) {
		t.Helper()
		if got != want {
			t.Errorf("%s = %v, Stats says %v", name, got, want)
		}
	}
	lane := func(name string) float64 { return value(t, fams, name, "lane", key) }
	eq("ceiling", lane("sluice_rate_ceiling_per_second"), after.Ceiling)
	if r := lane("sluice_rate_per_second"); r < min(before.Rate, after.Rate) || r > max(before.Rate, after.Rate) || r <= 0 {
		t.Errorf("rate = %v, Stats says %v then %v", r, before.Rate, after.Rate)
	}
	eq("in flight", lane("sluice_in_flight_requests"), float64(after.InFlight))
	eq("limit", lane("sluice_in_flight_limit"), float64(after.Limit))
	eq("latency", lane("sluice_latency_seconds"), after.Latency.Seconds())
	eq("baseline", lane("sluice_latency_baseline_seconds"), after.Baseline.Seconds())
	eq("retries denied", lane("sluice_retries_denied_total"), float64(after.RetriesDenied))
	eq("throttled (lane)", lv("sluice_throttled_total", sluice.Normal), float64(after.Throttled))
	eq("cooldowns", lane("sluice_cooldowns_total"), float64(after.Cooldowns))
	for p := sluice.Interactive; p <= sluice.Batch; p++ {
		s := after.Levels[p]
		eq("granted "+p.String(), lv("sluice_granted_total", p), float64(s.Granted))
		eq("cancelled "+p.String(), lv("sluice_cancelled_total", p), float64(s.Cancelled))
		eq("queued "+p.String(), lv("sluice_queued_requests", p), float64(s.Queued))
		eq("tenants "+p.String(), lv("sluice_tenants_active", p), float64(s.Tenants))
		for r := range s.Refused {
			reason := sluice.Reason(r).String()
			eq("refused "+p.String()+" "+reason, value(t, fams, "sluice_refused_total", "lane", key, "priority", p.String(), "reason", reason), float64(s.Refused[r]))
		}
		// The histogram, fed by the events, counts what Stats counts.
		h, ok := metric(fams, "sluice_wait_seconds", "lane", key, "priority", p.String())
		if !ok {
			t.Fatalf("no wait histogram for %s", p)
		}
		eq("wait count "+p.String(), float64(h.Histogram.GetSampleCount()), float64(s.Granted))
	}
	// The retry waited for the cooldown (about 1 s): the histogram's sum
	// holds it.
	h, _ := metric(fams, "sluice_wait_seconds", "lane", key, "priority", "normal")
	if h.Histogram.GetSampleSum() < 0.5 {
		t.Errorf("wait sum %v s, want the retry's wait for the 1 s cooldown in it", h.Histogram.GetSampleSum())
	}
	eq("events dropped", value(t, fams, "sluice_events_dropped_total"), float64(tr.Stats().EventsDropped))

	// The package doc's count: 96 series per lane label.
	series := 0
	for _, f := range fams {
		for _, m := range f.Metric {
			for _, lp := range m.Label {
				if lp.GetName() == "lane" && lp.GetValue() == key {
					series++
					if m.Histogram != nil {
						series += len(m.Histogram.Bucket) + 2 // with +Inf, _sum and _count: 17
					}
				}
			}
		}
	}
	if series != 96 {
		t.Errorf("%d series for one lane, the doc says 96", series)
	}

	problems, err := testutil.GatherAndLint(reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}

	// The same figures through CollectAndCompare's text format.
	var exp strings.Builder
	exp.WriteString("# HELP sluice_granted_total Attempts granted a token and an in-flight slot.\n# TYPE sluice_granted_total counter\n")
	for p := sluice.Interactive; p <= sluice.Batch; p++ {
		fmt.Fprintf(&exp, "sluice_granted_total{lane=%q,priority=%q} %d\n", key, p, after.Levels[p].Granted)
	}
	if err := testutil.CollectAndCompare(m, strings.NewReader(exp.String()), "sluice_granted_total"); err != nil {
		t.Error(err)
	}
}

// Lanes mapped to one label are summed; past WithMaxLanes they go under
// "other".
func TestLaneLabels(t *testing.T) {
	a, b, c := upstream(t), upstream(t), upstream(t)
	host := func(s *httptest.Server) string { return strings.TrimPrefix(s.URL, "http://") }
	m, err := sluiceprom.New(sluiceprom.WithMaxLanes(2), sluiceprom.WithLaneLabel(func(key string) string {
		if key == host(a) || key == host(b) {
			return "ab"
		}
		return key
	}))
	if err != nil {
		t.Fatal(err)
	}
	// With no retry, the 429 is an answer, not an error, and the lane
	// gets no second call before the next request.
	tr := newTransport(t, m, sluice.WithRetry(0))
	ctx := context.Background()
	for _, s := range []*httptest.Server{a, b} {
		if err := get(ctx, tr, s.URL); err != nil {
			t.Fatal(err)
		}
	}
	// One label left, taken by c; so d goes under "other".
	d := upstream(t)
	for _, s := range []*httptest.Server{c, d} {
		if err := get(ctx, tr, s.URL); err != nil {
			t.Fatal(err)
		}
	}
	if err := tr.WaitEvents(ctx); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(m)
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range []struct {
		label        string
		lanes, grant float64
	}{{"ab", 2, 2}, {host(c), 1, 1}, {"other", 1, 1}} {
		if n := value(t, fams, "sluice_lanes", "lane", w.label); n != w.lanes {
			t.Errorf("sluice_lanes{lane=%q} = %v, want %v", w.label, n, w.lanes)
		}
		if g := value(t, fams, "sluice_granted_total", "lane", w.label, "priority", "normal"); g != w.grant {
			t.Errorf("granted{lane=%q} = %v, want %v", w.label, g, w.grant)
		}
		h, ok := metric(fams, "sluice_wait_seconds", "lane", w.label, "priority", "normal")
		if !ok || float64(h.Histogram.GetSampleCount()) != w.grant {
			t.Errorf("wait histogram{lane=%q}: %v, want %v samples", w.label, h, w.grant)
		}
	}
	if _, ok := metric(fams, "sluice_lanes", "lane", host(d)); ok {
		t.Errorf("lane %s has a label of its own past the cap", host(d))
	}
}

func TestWatchAnotherPanics(t *testing.T) {
	m, _ := sluiceprom.New()
	tr1, _ := sluice.New(nil, sluice.WithObserver(m))
	tr2, _ := sluice.New(nil)
	m.Watch(tr1)
	m.Watch(tr1) // the same again is fine
	defer func() {
		if r := recover(); r == nil || !strings.Contains(fmt.Sprint(r), "sluiceprom: Watch") {
			t.Errorf("Watch of a second Transport: recovered %v, want a sluiceprom panic", r)
		}
	}()
	m.Watch(tr2)
}

func TestOptionsValidated(t *testing.T) {
	for _, c := range []struct {
		opt  sluiceprom.Option
		want string
	}{
		{sluiceprom.WithLaneLabel(nil), "sluiceprom: WithLaneLabel(nil)"},
		{sluiceprom.WithMaxLanes(-1), "sluiceprom: WithMaxLanes(-1)"},
		{sluiceprom.WithBuckets(), "sluiceprom: WithBuckets()"},
		{sluiceprom.WithBuckets(1, 0.5), "sluiceprom: WithBuckets([1 0.5])"},
	} {
		if _, err := sluiceprom.New(c.opt); err == nil || !strings.HasPrefix(err.Error(), c.want) {
			t.Errorf("New: %v, want an error starting %q", err, c.want)
		}
	}
	if _, err := sluiceprom.New(sluiceprom.WithMaxLanes(0), sluiceprom.WithBuckets(0.1, 1)); err != nil {
		t.Errorf("valid options: %v", err)
	}
}
