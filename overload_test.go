package sluice

import (
	"context"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluice-go/sluice/internal/verdict"
)

// overloadBase serves a call in latency while no more than capacity are in
// it, and answers any beyond them at once with 529 (Anthropic's
// overloaded_error), as a struggling server does. always: every call gets
// 529.
type overloadBase struct {
	capacity int
	latency  time.Duration
	always   bool
	// stream: it answers with an event stream, whose first event says it
	// is overloaded, as Anthropic's streaming API does, where it would
	// answer 529.
	stream bool

	mu             sync.Mutex
	in             int
	served, failed []time.Time
}

func (b *overloadBase) RoundTrip(req *http.Request) (*http.Response, error) {
	b.mu.Lock()
	if b.always || b.in >= b.capacity {
		b.failed = append(b.failed, time.Now())
		b.mu.Unlock()
		if b.stream {
			return &http.Response{StatusCode: 200, Request: req, Header: http.Header{"Content-Type": {"text/event-stream"}},
				Body: io.NopCloser(strings.NewReader(sseOverloaded))}, nil
		}
		return &http.Response{StatusCode: verdict.StatusOverloaded, Request: req,
			Body: io.NopCloser(strings.NewReader(`{"type":"error","error":{"type":"overloaded_error"}}`))}, nil
	}
	b.in++
	b.mu.Unlock()
	select {
	case <-time.After(b.latency):
	case <-req.Context().Done():
	}
	b.mu.Lock()
	b.in--
	b.served = append(b.served, time.Now())
	b.mu.Unlock()
	if b.stream {
		return &http.Response{StatusCode: 200, Request: req, Header: http.Header{"Content-Type": {"text/event-stream"}},
			Body: io.NopCloser(strings.NewReader("event: message_start\ndata: {}\n\n"))}, nil
	}
	return &http.Response{StatusCode: 200, Request: req, Body: io.NopCloser(strings.NewReader("ok"))}, nil
}

// count returns the calls served and refused from from on.
func (b *overloadBase) count(from time.Time) (served, failed int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, t := range b.served {
		if !t.Before(from) {
			served++
		}
	}
	for _, t := range b.failed {
		if !t.Before(from) {
			failed++
		}
	}
	return served, failed
}

// closedLoop runs workers that send through tr as fast as it lets them
// for d; a worker whose request fails tries again a millisecond later.
func closedLoop(ctx context.Context, tr http.RoundTripper, workers int, d time.Duration) {
	ctx, cancel := context.WithCancel(ctx) // no deadline: nothing is refused for it
	defer cancel()
	time.AfterFunc(d, cancel)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for ctx.Err() == nil {
				if err := get(ctx, tr, ""); err != nil {
					time.Sleep(time.Millisecond)
				}
			}
		})
	}
	wg.Wait()
}

// TestOverloadCutsLimit: a server that answers a fast 529 once more than 8
// calls are in it. The 529s are no latency samples (they would say the
// server is fast and raise the limit) and each round of them cuts the
// in-flight limit, so the lane settles near the server's capacity with few
// 529s, where Little's law alone (50 calls at 1,000/s and 50 ms) would keep
// most calls failing.
func TestOverloadCutsLimit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &overloadBase{capacity: 8, latency: 50 * time.Millisecond}
		tr := mustNew(t, base, WithRate(1000, time.Second), WithRetry(0))
		start := time.Now()
		closedLoop(t.Context(), tr, 64, 20*time.Second)
		served, failed := base.count(start.Add(10 * time.Second))
		s, _ := tr.LaneStats("api.test")
		t.Logf("second half: %d served (%.0f/s), %d refused (%.1f%%); limit %d", served, float64(served)/10,
			failed, 100*float64(failed)/float64(served+failed), s.Limit)
		// The server's capacity is 8 / 50 ms = 160/s.
		if float64(served)/10 < 0.75*160 {
			t.Errorf("served %.0f/s, want at least 0.75 of the server's 160/s", float64(served)/10)
		}
		if share := float64(failed) / float64(served+failed); share > 0.2 {
			t.Errorf("%.0f%% of the calls in the second half got 529, want at most 20%%", 100*share)
		}
	})
}

// TestStreamOverloadCutsAsAStatus: a server that holds 8 calls at a time
// says it is overloaded in the first event of a stream, where it would
// answer 529. The stream's slot goes back at that event, so the cut
// counts it and the attempts in flight with it, as a 529's does: from
// 64 callers at once, the lane is served within a tenth of what it is
// against 529s over the first seconds (a slot given back with the
// headers left the cut to count the few attempts still waiting for
// theirs, 2 to 5 where the server holds 8, and the limit climbed back a
// slot a second).
func TestStreamOverloadCutsAsAStatus(t *testing.T) {
	served := func(stream bool) (float64, int) {
		var n, limit int
		synctest.Test(t, func(t *testing.T) {
			base := &overloadBase{capacity: 8, latency: 50 * time.Millisecond, stream: stream}
			tr := mustNew(t, base, WithRate(1000, time.Second), WithRetry(0))
			start := time.Now()
			closedLoop(t.Context(), tr, 64, 5*time.Second)
			n, _ = base.count(start.Add(time.Second))
			s, _ := tr.LaneStats("api.test")
			limit = s.Limit
		})
		return float64(n) / 4, limit
	}
	status, sl := served(false)
	stream, tl := served(true)
	t.Logf("from 1 s to 5 s: 529s %.0f/s (limit %d), overloaded streams %.0f/s (limit %d); the server holds 160/s", status, sl, stream, tl)
	if stream < 0.9*status {
		t.Errorf("overloaded streams served %.0f/s, under 0.9 of the %.0f/s served beside 529s", stream, status)
	}
}

// TestOverloadNeverRaisesLimit: a phase of nothing but fast 529s leaves the
// in-flight limit where it was or lower; it never raises it, on a lane
// with no rate, which its latency alone sizes (fast answers would say the
// server has room). And the lane, at its floor, pauses rather than send
// as fast as the answers come.
func TestOverloadNeverRaisesLimit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &overloadBase{capacity: 8, latency: 50 * time.Millisecond}
		tr := mustNew(t, base, WithRetry(0))
		closedLoop(t.Context(), tr, 16, 5*time.Second)
		before, _ := tr.LaneStats("api.test")
		base.mu.Lock()
		base.always = true
		base.mu.Unlock()
		var most int
		done := make(chan struct{})
		end := time.Now().Add(5 * time.Second)
		go func() {
			defer close(done)
			for time.Now().Before(end) {
				s, _ := tr.LaneStats("api.test")
				most = max(most, s.Limit)
				time.Sleep(10 * time.Millisecond)
			}
		}()
		phase := time.Now()
		closedLoop(t.Context(), tr, 16, 5*time.Second)
		<-done
		if most > before.Limit {
			t.Errorf("limit rose from %d to %d in a phase of 529s alone", before.Limit, most)
		}
		// At the limit's floor the lane pauses, twice as long at each
		// overload: 5 s of instant 529s draw a few rounds, not a flood.
		_, failed := base.count(phase)
		t.Logf("limit %d before, at most %d during; %d calls in 5 s of instant 529s", before.Limit, most, failed)
		if failed > 200 {
			t.Errorf("%d calls in 5 s of instant 529s, want at most 200", failed)
		}
	})
}

// TestStreamOverloadPauses: TestOverloadNeverRaisesLimit's phase of
// overloads, with streams whose first event says the server is
// overloaded, held (HoldStream) or not: either way the lane, at its floor,
// pauses, longer at each overload in a row. A held stream refused so is
// no served call when its body is done, which would end the pauses.
func TestStreamOverloadPauses(t *testing.T) {
	for _, c := range []struct {
		name string
		ctx  func(context.Context) context.Context
	}{
		{"not held", func(ctx context.Context) context.Context { return ctx }},
		{"held", HoldStream},
	} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				base := &overloadBase{capacity: 8, latency: 50 * time.Millisecond, stream: true}
				tr := mustNew(t, base, WithRetry(0))
				ctx := c.ctx(t.Context())
				closedLoop(ctx, tr, 16, 5*time.Second)
				base.mu.Lock()
				base.always = true
				base.mu.Unlock()
				phase := time.Now()
				closedLoop(ctx, tr, 16, 20*time.Second)
				_, failed := base.count(phase)
				t.Logf("%d calls in 20 s of overloaded streams", failed)
				if failed > 50 {
					t.Errorf("%d calls in 20 s of overloaded streams, want at most 50: at its floor the lane pauses, longer each time", failed)
				}
			})
		})
	}
}

// TestOverloadCapGrowsBackInRoundTrips: a lane paced at 1/s whose calls
// take 20 s (a model's answer, not streamed) keeps about 20 in flight. The
// server answers 529 at once for 30 s, then serves again. The overload's
// cut takes the limit to its floor; its cap grows back a quarter a round
// trip, where a window of 16 samples would take minutes at one call in
// flight: within minutes of the server's recovery the lane serves its
// rate again.
func TestOverloadCapGrowsBackInRoundTrips(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &overloadBase{capacity: 1000, latency: 20 * time.Second}
		tr := mustNew(t, base, WithRate(60, time.Minute), WithRetry(0))
		ctx, cancel := context.WithCancel(t.Context())
		var wg sync.WaitGroup
		wg.Go(func() { closedLoop(ctx, tr, 40, time.Hour) })
		start := time.Now()
		time.Sleep(2 * time.Minute)
		before, _ := base.count(start.Add(time.Minute))
		base.mu.Lock()
		base.always = true
		base.mu.Unlock()
		time.Sleep(30 * time.Second)
		base.mu.Lock()
		base.always = false
		base.mu.Unlock()
		time.Sleep(2 * time.Minute)
		from := time.Now()
		var limits []int
		for range 10 {
			time.Sleep(30 * time.Second)
			s, _ := tr.LaneStats("api.test")
			limits = append(limits, s.Limit)
		}
		after, _ := base.count(from)
		cancel()
		wg.Wait()
		b, a := float64(before)/60, float64(after)/300
		t.Logf("served %.2f/s before the 30 s of 529s; %.2f/s from 2 to 7 min after they ended; limit every 30 s: %v", b, a, limits)
		if a < 0.5*b {
			t.Errorf("served %.2f/s from 2 to 7 min after a 30 s overload, want at least half the %.2f/s before it", a, b)
		}
	})
}
