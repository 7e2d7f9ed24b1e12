package sluicestatus

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/goleak"

	"github.com/sluice-go/sluice"
)

// TestMain checks, after the tests outside synctest bubbles, that no
// goroutine was left behind; synctest checks those inside.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// api is an in-memory upstream: it answers after latency (virtual time in
// a bubble), with a 429 and Retry-After for the first throttle requests.
type api struct {
	latency  time.Duration
	throttle atomic.Int64
}

func (a *api) RoundTrip(req *http.Request) (*http.Response, error) {
	time.Sleep(a.latency)
	resp := &http.Response{StatusCode: http.StatusOK, Header: http.Header{}, Body: io.NopCloser(strings.NewReader("ok")), Request: req}
	if a.throttle.Add(-1) >= 0 {
		resp.StatusCode = http.StatusTooManyRequests
		resp.Header.Set("Retry-After", "2")
	}
	return resp, nil
}

// load sends n GETs to host through tr, from n goroutines, at priority p,
// and returns a func that waits for them.
func load(t *testing.T, tr *sluice.Transport, host string, p sluice.Priority, n int) (wait func()) {
	t.Helper()
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			req, _ := http.NewRequestWithContext(sluice.WithPriority(t.Context(), p), http.MethodGet, "http://"+host+"/x", nil)
			resp, err := tr.RoundTrip(req)
			if err != nil {
				if t.Context().Err() == nil && !errors.Is(err, sluice.ErrClosed) { // not the test's end
					t.Errorf("GET %s: %v", host, err)
				}
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		})
	}
	t.Cleanup(wg.Wait) // after a failure, once the context has ended them
	return wg.Wait
}

func mustNew(t *testing.T, tr *sluice.Transport, opts ...Option) *Handler {
	t.Helper()
	h, err := New(tr, opts...)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { h.Close() })
	return h
}

func getFeed(t *testing.T, h http.Handler, query string) feedJSON {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/?format=json"+query, nil))
	if rec.Code != http.StatusOK || rec.Header().Get("Content-Type") != "application/json" {
		t.Fatalf("GET ?format=json: %d %q", rec.Code, rec.Header().Get("Content-Type"))
	}
	var f feedJSON
	if err := json.Unmarshal(rec.Body.Bytes(), &f); err != nil {
		t.Fatalf("decoding the feed: %v\n%s", err, rec.Body.String())
	}
	return f
}

func near(got, want, rel float64) bool { return math.Abs(got-want) <= rel*math.Abs(want) }

// TestFeedReflectsStats loads a lane paced to 20/s, with one 429 that
// cools it down for 2 s, and checks the feed against Stats: the figures
// now, the counts, and the history's rate and cooldown.
func TestFeedReflectsStats(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		up := &api{latency: 50 * time.Millisecond}
		up.throttle.Store(1)
		tr, err := sluice.New(up, sluice.WithRate(20, time.Second), sluice.WithRetry(3))
		if err != nil {
			t.Fatal(err)
		}
		defer tr.Close()
		h := mustNew(t, tr)

		wait := load(t, tr, "a.test", sluice.Batch, 200)
		time.Sleep(5*time.Second + time.Millisecond) // 5 samples in, 100 of the 200 sent
		synctest.Wait()
		f := getFeed(t, h, "")
		st, ok := tr.LaneStats("a.test")
		if !ok || len(f.Shown) != 1 || f.Lanes != 1 {
			t.Fatalf("feed shows %d of %d lanes, Stats has a.test: %v", len(f.Shown), f.Lanes, ok)
		}
		l := f.Shown[0]
		if l.Key != "a.test" || l.Rate != st.Rate || l.Ceiling != 20 || l.InFlight != st.InFlight || l.Limit != st.Limit {
			t.Errorf("feed %q rate %v ceiling %v in flight %d/%d; Stats rate %v ceiling %v in flight %d/%d",
				l.Key, l.Rate, l.Ceiling, l.InFlight, l.Limit, st.Rate, st.Ceiling, st.InFlight, st.Limit)
		}
		for p, lv := range l.Levels {
			sl := st.Levels[p]
			if lv.Name != sluice.Priority(p).String() || lv.Queued != sl.Queued || lv.Granted != sl.Granted ||
				lv.OldestWait != secs(sl.OldestWait) || lv.WaitP99 != secs(sl.WaitP99) {
				t.Errorf("level %d: feed %+v, Stats %+v", p, lv, sl)
			}
		}
		if q := l.Levels[sluice.Batch].Queued; q < 50 {
			t.Errorf("batch queue %d, want most of the 200 still waiting", q)
		}
		if l.Throttled != 1 || l.RecentThrottled != 1 || l.Cooldowns != 1 || l.RecentCooldowns != 1 {
			t.Errorf("429s %d (recent %d), cooldowns %d (recent %d), want 1 of each", l.Throttled, l.RecentThrottled, l.Cooldowns, l.RecentCooldowns)
		}
		hist := l.History
		// The lane came after New's sample: its history starts at 1 s.
		if len(hist.T) != 5 {
			t.Fatalf("%d samples after 5 s, want 5", len(hist.T))
		}
		// The 429 came first and cooled the lane 2 s: the first samples
		// after it see a cooldown, the last ones the lane at its pace.
		if !hist.Cooling[0] || !hist.Cooling[1] || hist.Cooling[2] || hist.Throttled[0] != 1 {
			t.Errorf("cooling %v, 429s %v: want a cooldown at 1 s and 2 s, not after, and the 429 in the first second", hist.Cooling, hist.Throttled)
		}
		if a := hist.Achieved[4]; !near(a, st.Rate, 0.15) || a == 0 {
			t.Errorf("achieved %v/s in the last second, want the lane's pace %v/s within 15%%", a, st.Rate)
		}
		if l.Achieved != hist.Achieved[4] {
			t.Errorf("achieved now %v, want the latest sample's %v", l.Achieved, hist.Achieved[4])
		}
		up.throttle.Store(0)
		wait()
	})
}

// TestHistoryBounded runs a minute with a 10 s history: each lane keeps
// the latest 10 samples, a second apart, and no more.
func TestHistoryBounded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr, err := sluice.New(&api{latency: 10 * time.Millisecond}, sluice.WithRate(50, time.Second))
		if err != nil {
			t.Fatal(err)
		}
		defer tr.Close()
		h := mustNew(t, tr, WithHistory(10*time.Second))
		wait := load(t, tr, "a.test", sluice.Normal, 3000) // a minute of work at 50/s
		time.Sleep(60*time.Second + time.Millisecond)
		synctest.Wait()
		f := getFeed(t, h, "")
		if f.History != 10 || len(f.Shown) != 1 {
			t.Fatalf("history %v s, %d lanes shown", f.History, len(f.Shown))
		}
		hist := f.Shown[0].History
		if len(hist.T) != 10 {
			t.Fatalf("%d samples kept, want 10", len(hist.T))
		}
		for i := 1; i < len(hist.T); i++ {
			if d := hist.T[i] - hist.T[i-1]; d != 1000 {
				t.Errorf("samples %d and %d are %d ms apart, want 1000", i-1, i, d)
			}
		}
		if hist.T[9] != f.Sampled {
			t.Errorf("latest sample at %d, the feed says %d", hist.T[9], f.Sampled)
		}
		// ?since= sends only the samples after it.
		g := getFeed(t, h, fmt.Sprintf("&since=%d", hist.T[6]))
		if got := g.Shown[0].History.T; len(got) != 3 || got[0] != hist.T[7] {
			t.Errorf("since the 7th sample: %v, want the last 3 of %v", got, hist.T)
		}
		wait()
	})
}

// TestMaxLanes: with more lanes than MaxLanes, the busiest are shown and
// the count says how many there are.
func TestMaxLanes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr, err := sluice.New(&api{latency: 100 * time.Millisecond}, sluice.WithRate(100, time.Second))
		if err != nil {
			t.Fatal(err)
		}
		defer tr.Close()
		h := mustNew(t, tr, WithMaxLanes(2))
		var waits []func()
		for i, n := range []int{5, 300, 20, 400, 10} { // b and d are the busiest
			waits = append(waits, load(t, tr, string(rune('a'+i))+".test", sluice.Normal, n))
		}
		time.Sleep(3*time.Second + time.Millisecond)
		synctest.Wait()
		f := getFeed(t, h, "")
		var keys []string
		for _, l := range f.Shown {
			keys = append(keys, l.Key)
		}
		if f.Lanes != 5 || strings.Join(keys, " ") != "b.test d.test" {
			t.Errorf("%d lanes, shown %v; want 5 lanes and the busiest two, b.test and d.test", f.Lanes, keys)
		}
		for _, w := range waits {
			w()
		}
	})
}

// TestCloseStopsSampler: after Close no sample is taken, the page is still
// served, and Close may be called again.
func TestCloseStopsSampler(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr, err := sluice.New(&api{}, sluice.WithRate(10, time.Second))
		if err != nil {
			t.Fatal(err)
		}
		defer tr.Close()
		h := mustNew(t, tr)
		load(t, tr, "a.test", sluice.Normal, 1)()
		time.Sleep(2500 * time.Millisecond)
		h.Close()
		before := getFeed(t, h, "")
		time.Sleep(10 * time.Second)
		after := getFeed(t, h, "")
		if before.Sampled != after.Sampled || len(after.Shown) != 1 || len(after.Shown[0].History.T) != 2 {
			t.Errorf("after Close: sampled %d then %d, %d lanes; want no new sample and the 2 taken", before.Sampled, after.Sampled, len(after.Shown))
		}
		if err := h.Close(); err != nil {
			t.Errorf("second Close: %v", err)
		}
	})
}

// externalRef matches what would make a browser fetch something: a URL
// with a scheme or a protocol-relative one, a src attribute, a stylesheet
// link, a CSS import or url().
var externalRef = regexp.MustCompile(`(?i)(https?:|//[a-z0-9.-]+\.[a-z]{2,}|\bsrc\s*=|<link\b|@import|url\()`)

func TestPageHasNoExternalURL(t *testing.T) {
	tr, err := sluice.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	h := mustNew(t, tr)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/debug/sluice/", nil))
	body := rec.Body.String()
	if rec.Code != http.StatusOK || !strings.HasPrefix(rec.Header().Get("Content-Type"), "text/html") {
		t.Fatalf("GET: %d %q", rec.Code, rec.Header().Get("Content-Type"))
	}
	if m := externalRef.FindAllString(body, -1); m != nil {
		t.Errorf("the page refers outside itself: %q", m)
	}
	if csp := rec.Header().Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'none'") || !strings.Contains(csp, "connect-src 'self'") {
		t.Errorf("Content-Security-Policy %q, want default-src 'none' and connect-src 'self'", csp)
	}
	for _, want := range []string{"<svg", "format=json", "<script>"} {
		if !strings.Contains(body, want) {
			t.Errorf("the page has no %q", want)
		}
	}
	// The test's own pattern finds what it is meant to.
	for _, bad := range []string{`<img src="x.png">`, `fetch("https://cdn.example.com/x")`, `<link rel=stylesheet href=a.css>`} {
		if !externalRef.MatchString(bad) {
			t.Errorf("externalRef misses %q", bad)
		}
	}
}

func TestMethods(t *testing.T) {
	tr, err := sluice.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	h := mustNew(t, tr)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/", nil))
	if rec.Code != http.StatusMethodNotAllowed || rec.Header().Get("Allow") != "GET, HEAD" {
		t.Errorf("POST: %d, Allow %q", rec.Code, rec.Header().Get("Allow"))
	}
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodHead, "/?format=json", nil))
	if rec.Code != http.StatusOK || rec.Body.Len() != 0 || rec.Header().Get("Content-Type") != "application/json" {
		t.Errorf("HEAD: %d, %d bytes, %q", rec.Code, rec.Body.Len(), rec.Header().Get("Content-Type"))
	}
}

func TestOptionsValidated(t *testing.T) {
	tr, err := sluice.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	for _, c := range []struct {
		opts []Option
		want string
	}{
		{[]Option{WithInterval(0)}, "WithInterval(0s)"},
		{[]Option{WithInterval(time.Millisecond)}, "WithInterval(1ms)"},
		{[]Option{WithHistory(-time.Second)}, "WithHistory(-1s)"},
		{[]Option{WithHistory(500 * time.Millisecond)}, "WithHistory(500ms): shorter than the interval 1s"},
		{[]Option{WithInterval(10 * time.Millisecond), WithHistory(time.Hour)}, "WithHistory(1h0m0s)"},
		{[]Option{WithMaxLanes(0)}, "WithMaxLanes(0)"},
		{[]Option{WithMaxLanes(1001)}, "WithMaxLanes(1001)"},
	} {
		h, err := New(tr, c.opts...)
		if err == nil {
			h.Close()
			t.Errorf("New(%s) succeeded", c.want)
			continue
		}
		if !errors.Is(err, ErrInvalidOption) || !strings.HasPrefix(err.Error(), "sluicestatus: ") || !strings.Contains(err.Error(), c.want) {
			t.Errorf("New: %v; want an ErrInvalidOption naming %s", err, c.want)
		}
	}
	if _, err := New(nil); !errors.Is(err, ErrInvalidOption) {
		t.Errorf("New(nil): %v", err)
	}
	h, err := New(tr, WithInterval(10*time.Millisecond), WithHistory(time.Minute), WithMaxLanes(1000))
	if err != nil {
		t.Fatalf("New with options at their bounds: %v", err)
	}
	h.Close()
}
