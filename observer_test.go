package sluice

import (
	"bytes"
	"context"
	"errors"
	"github.com/sluice-go/sluice/internal/pace"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// recorder is an Observer that keeps every event, with the context's
// request tag.
type recorder struct {
	mu     sync.Mutex
	events []Event
	tags   []string
}

type tagKey struct{}

func (r *recorder) Observe(ctx context.Context, e Event) {
	tag, _ := ctx.Value(tagKey{}).(string)
	r.mu.Lock()
	r.events = append(r.events, e)
	r.tags = append(r.tags, tag)
	r.mu.Unlock()
}

func (r *recorder) of(k EventKind) []Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	var es []Event
	for _, e := range r.events {
		if e.Kind == k {
			es = append(es, e)
		}
	}
	return es
}

func TestObserverSeesTheLaneWork(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// The upstream refuses the third request with a 429 and
		// Retry-After: 2, and accepts everything else.
		var n atomic.Int32
		base := &fakeBase{answer: func(req *http.Request) *http.Response {
			if n.Add(1) == 3 {
				return &http.Response{StatusCode: 429, Header: http.Header{"Retry-After": {"2"}}, Body: http.NoBody}
			}
			return &http.Response{StatusCode: 200, Header: http.Header{}, Body: io.NopCloser(strings.NewReader("ok"))}
		}}
		rec := &recorder{}
		tr := mustNew(t, base, WithRate(10, time.Second), WithObserver(rec),
			WithMaxWait(Batch, 50*time.Millisecond))
		var wg sync.WaitGroup
		for i := range 3 {
			ctx := context.WithValue(context.Background(), tagKey{}, "req")
			wg.Go(func() {
				time.Sleep(time.Duration(i) * time.Millisecond) // in order
				if err := get(ctx, tr, ""); err != nil {
					t.Errorf("request %d: %v", i, err)
				}
			})
		}
		wg.Wait()
		// The lane now cools down for 2 s: a batch request that may wait
		// 50 ms is refused.
		err := get(WithPriority(context.Background(), Batch), tr, "")
		if !errors.Is(err, ErrRejected) {
			t.Fatalf("batch request during the cooldown: %v, want ErrRejected", err)
		}
		if err := tr.WaitEvents(context.Background()); err != nil {
			t.Fatal(err)
		}

		granted := rec.of(EventGranted)
		// Three first attempts and one retry.
		if len(granted) != 4 {
			t.Fatalf("%d granted events, want 4: %+v", len(granted), granted)
		}
		if g := granted[0]; g.Wait != 0 || g.Lane != "api.test" || g.Attempt != 1 || g.Priority != Normal {
			t.Errorf("first grant %+v, want no wait, lane api.test, attempt 1, Normal", g)
		}
		// The second and third queued behind a token each (100 ms apart).
		q := rec.of(EventQueued)
		if len(q) < 2 {
			t.Errorf("%d queued events, want at least 2", len(q))
		}
		for _, e := range q {
			if e.Lane != "api.test" || e.Queued < 1 || e.Time.IsZero() || e.Attempt != 0 {
				t.Errorf("queued event %+v, want lane api.test, a queue length, a time and no attempt", e)
			}
		}
		if w := granted[2].Wait; w < 150*time.Millisecond || w > 200*time.Millisecond {
			t.Errorf("third grant waited %v, want about 200 ms less its 2 ms head start", w)
		}
		th := rec.of(EventThrottled)
		if len(th) != 1 || th[0].Status != 429 {
			t.Fatalf("throttled events %+v, want one 429", th)
		}
		cool := rec.of(EventCooldown)
		if len(cool) != 1 || cool[0].Cause != "retry-after" || cool[0].Wait != 2*time.Second {
			t.Fatalf("cooldown events %+v, want one of 2 s for retry-after", cool)
		}
		re := rec.of(EventRetried)
		if len(re) != 1 || re[0].Attempt != 2 || re[0].Status != 429 {
			t.Fatalf("retried events %+v, want attempt 2 after a 429", re)
		}
		if g := granted[3]; g.Attempt != 2 || g.Wait < 2*time.Second-300*time.Millisecond {
			t.Errorf("the retry's grant %+v, want attempt 2 after the cooldown", g)
		}
		rate := rec.of(EventRateChanged)
		if len(rate) == 0 || rate[0].Cause != RateCut || rate[0].From != 10 || rate[0].To >= 10 {
			t.Fatalf("rate events %+v, want a cut from 10/s", rate)
		}
		ref := rec.of(EventRefused)
		if len(ref) != 1 || ref[0].Reason != ReasonMaxWait || ref[0].Priority != Batch || !errors.Is(ref[0].Err, ErrRejected) {
			t.Fatalf("refused events %+v, want one Batch refusal for max wait", ref)
		}
		// Every event of an attempt carries the request's context.
		rec.mu.Lock()
		for i, e := range rec.events {
			req := e.Kind != EventRateChanged && e.Kind != EventLimitChanged && e.Priority != Batch
			if req && rec.tags[i] != "req" {
				t.Errorf("event %v without the request's context", e.Kind)
			}
			if e.Time.IsZero() {
				t.Errorf("event %v without a time", e.Kind)
			}
		}
		rec.mu.Unlock()
	})
}

func TestObserverLimitChanged(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &recorder{}
		base := &fakeBase{latency: 100 * time.Millisecond}
		tr := mustNew(t, base, WithRate(100, time.Second), WithObserver(rec))
		var wg sync.WaitGroup
		for range 200 {
			wg.Go(func() { get(context.Background(), tr, "") })
		}
		wg.Wait()
		tr.WaitEvents(context.Background())
		lc := rec.of(EventLimitChanged)
		if len(lc) == 0 {
			t.Fatal("no limit change while the lane learned its latency")
		}
		last := lc[len(lc)-1]
		if ls, _ := tr.LaneStats("api.test"); int(last.To) != ls.Limit {
			t.Errorf("last limit change to %v, Stats says %d", last.To, ls.Limit)
		}
	})
}

// An Observer that panics or blocks must not break or stall the lane.
func TestObserverPanicsAndBlocks(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var logs bytes.Buffer
		var lmu sync.Mutex
		logger := slog.New(slog.NewTextHandler(&lockedWriter{w: &logs, mu: &lmu}, nil))
		release := make(chan struct{})
		var seen atomic.Int64
		panicky := ObserverFunc(func(context.Context, Event) { panic("observer bug") })
		blocking := ObserverFunc(func(context.Context, Event) {
			seen.Add(1)
			<-release
		})
		// No request waits for a token: each makes one event, a grant.
		tr := mustNew(t, nopBase{}, WithRate(1e6, time.Second), WithBurst(1<<20), WithConcurrency(8, 8), WithLogger(logger),
			WithObserver(panicky), WithObserver(blocking))
		// Were a request to wait for the blocked Observer, the bubble
		// would deadlock here: release is closed only after.
		const n = 3 * eventCap
		for range n {
			if err := get(context.Background(), tr, ""); err != nil {
				t.Fatal(err)
			}
		}
		dropped := tr.Stats().EventsDropped
		if dropped == 0 {
			t.Error("no event dropped while the Observer blocked")
		}
		close(release)
		tr.WaitEvents(context.Background())
		// Every event reached the blocking Observer or was dropped.
		if got := uint64(seen.Load()) + dropped; got != n {
			t.Errorf("%d delivered + %d dropped, want %d events", seen.Load(), dropped, n)
		}
		lmu.Lock()
		if c := strings.Count(logs.String(), "Observer panicked"); c != 1 {
			t.Errorf("the panic was logged %d times, want once:\n%s", c, logs.String())
		}
		lmu.Unlock()
	})
}

type lockedWriter struct {
	w  io.Writer
	mu *sync.Mutex
}

func (w *lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.w.Write(p)
}

func TestWithObserverNil(t *testing.T) {
	_, err := New(nil, WithObserver(nil))
	if !errors.Is(err, ErrInvalidOption) || !strings.Contains(err.Error(), "WithObserver(nil)") {
		t.Fatalf("New(WithObserver(nil)) = %v, want ErrInvalidOption naming it", err)
	}
}

// TestObserverOverloaded: each overload, a 529 or a stream's first event
// about overload, is an EventOverloaded with the request's context, its
// status (0 for a stream) and cause, and the limit it left; the last one's
// limit is the lane's.
func TestObserverOverloaded(t *testing.T) {
	for _, c := range []struct {
		name   string
		base   http.RoundTripper
		status int
		cause  string
	}{
		{"529", &overloadBase{always: true}, 529, OverloadStatus},
		{"stream", sseBase{sseOverloaded}, 0, OverloadStream},
	} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				rec := &recorder{}
				tr := mustNew(t, c.base, WithRate(100, time.Second), WithConcurrency(1, 32), WithRetry(0), WithObserver(rec))
				ctx := context.WithValue(t.Context(), tagKey{}, "req")
				const n = 6
				for range n {
					req, _ := http.NewRequestWithContext(ctx, "POST", "http://api.test/v1/messages", nil)
					resp, err := tr.RoundTrip(req)
					if err != nil {
						t.Fatal(err)
					}
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
				tr.WaitEvents(t.Context())
				ov := rec.of(EventOverloaded)
				if len(ov) != n {
					t.Fatalf("%d overloaded events, want %d: %+v", len(ov), n, ov)
				}
				for _, e := range ov {
					if e.Lane != "api.test" || e.Status != c.status || e.Cause != c.cause || e.Priority != Normal {
						t.Errorf("overloaded event %+v, want lane api.test, status %d, cause %q, Normal", e, c.status, c.cause)
					}
				}
				if ov[0].From != 32 || ov[0].To >= ov[0].From {
					t.Errorf("first overload took the limit from %v to %v, want a cut from 32", ov[0].From, ov[0].To)
				}
				ls, _ := tr.LaneStats("api.test")
				if last := ov[n-1]; int(last.To) != ls.Limit {
					t.Errorf("last overload left the limit at %v, Stats says %d", last.To, ls.Limit)
				}
				// At the floor the lane pauses: the event says for how long,
				// and a cooldown follows.
				if ov[n-1].Wait <= 0 || len(rec.of(EventCooldown)) == 0 {
					t.Errorf("last overload %+v at the floor, want a pause and a cooldown event", ov[n-1])
				}
				rec.mu.Lock()
				for i, e := range rec.events {
					if e.Kind == EventOverloaded && rec.tags[i] != "req" {
						t.Errorf("overloaded event without the request's context")
					}
				}
				rec.mu.Unlock()
			})
		})
	}
}

// TestRateCausesArePacers: the causes an Observer sees are the ones the
// lane's pacer reports, passed on as they are.
func TestRateCausesArePacers(t *testing.T) {
	for _, c := range [][2]string{{RateCut, pace.CauseCut}, {RateHeader, pace.CauseHeader}, {RateRecovery, pace.CauseRecovery}} {
		if c[0] != c[1] {
			t.Errorf("cause %q reported by the pacer as %q", c[0], c[1])
		}
	}
}
