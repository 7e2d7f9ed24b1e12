package sluice

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// sseBody streams a token every interval for n tokens, the first at once.
type sseBody struct {
	n, sent  int
	interval time.Duration
}

func (b *sseBody) Read(p []byte) (int, error) {
	if b.sent == b.n {
		return 0, io.EOF
	}
	if b.sent > 0 {
		time.Sleep(b.interval)
	}
	b.sent++
	return copy(p, "data: tok\n\n"), nil
}

func (b *sseBody) Close() error { return nil }

// llmBase answers /quick after 50 ms, and /stream with server-sent events
// after 100 ms: a token every 100 ms for 3 s.
var llmBase = rtFunc(func(req *http.Request) (*http.Response, error) {
	if strings.HasSuffix(req.URL.Path, "/stream") {
		time.Sleep(100 * time.Millisecond)
		return &http.Response{StatusCode: 200, Header: http.Header{"Content-Type": {"text/event-stream; charset=utf-8"}},
			Body: &sseBody{n: 30, interval: 100 * time.Millisecond}, Request: req}, nil
	}
	time.Sleep(50 * time.Millisecond)
	return &http.Response{StatusCode: 200, Header: http.Header{}, Body: io.NopCloser(strings.NewReader("ok")), Request: req}, nil
})

// streamRun makes 20 quick calls at 10/s through rt, then starts six
// streams at once and an Interactive quick call with a 1 s deadline 200 ms
// later; it returns each stream's time to its first token, and the quick
// call's error.
func streamRun(t *testing.T, rt http.RoundTripper) (first []time.Duration, quickErr error) {
	call := func(ctx context.Context, path string) (*http.Response, error) {
		req, _ := http.NewRequestWithContext(ctx, "POST", "http://api.test"+path, nil)
		return rt.RoundTrip(req)
	}
	for range 20 {
		resp, err := call(t.Context(), "/quick")
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		time.Sleep(100 * time.Millisecond)
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for range 6 {
		wg.Go(func() {
			t0 := time.Now()
			resp, err := call(t.Context(), "/stream")
			if err != nil {
				t.Error(err)
				return
			}
			defer resp.Body.Close()
			buf := make([]byte, 64)
			if _, err := resp.Body.Read(buf); err != nil {
				t.Error(err)
			}
			mu.Lock()
			first = append(first, time.Since(t0))
			mu.Unlock()
			io.Copy(io.Discard, resp.Body)
		})
	}
	time.Sleep(200 * time.Millisecond)
	ctx, cancel := context.WithTimeout(WithPriority(t.Context(), Interactive), time.Second)
	defer cancel()
	if resp, err := call(ctx, "/quick"); err != nil {
		quickErr = err
	} else {
		resp.Body.Close()
	}
	wg.Wait()
	return first, quickErr
}

// TestStreamsDoNotHoldTheLane: six 3 s streams started after 20 quick
// calls, with sluice's defaults, get their first token within 150 ms of
// the same run without sluice, and an Interactive quick call with a 1 s
// deadline is served meanwhile (before: a second stream's first token came
// after 3.1 s, and the quick call failed).
func TestStreamsDoNotHoldTheLane(t *testing.T) {
	var bare, through []time.Duration
	var quickErr error
	synctest.Test(t, func(t *testing.T) { bare, _ = streamRun(t, llmBase) })
	synctest.Test(t, func(t *testing.T) {
		through, quickErr = streamRun(t, mustNew(t, llmBase))
	})
	var table strings.Builder
	fmt.Fprintf(&table, "\nfirst token: without sluice %v, with sluice %v", bare, through)
	t.Log(table.String())
	if len(through) != 6 {
		t.Fatalf("%d streams started", len(through))
	}
	worstBare := bare[len(bare)-1]
	for _, d := range through {
		if d > worstBare+150*time.Millisecond {
			t.Errorf("a stream's first token after %v, without sluice %v", d, worstBare)
		}
	}
	if quickErr != nil {
		t.Errorf("Interactive quick call with a 1 s deadline: %v", quickErr)
	}
}

// TestHoldStream: with HoldStream, a stream keeps its slot until its body
// is done.
func TestHoldStream(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := mustNew(t, llmBase, WithConcurrency(1, 1))
		req, _ := http.NewRequestWithContext(HoldStream(t.Context()), "POST", "http://api.test/stream", nil)
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		if s, _ := tr.Stats().Lane("api.test"); s.InFlight != 1 {
			t.Errorf("held stream: %d in flight, want 1", s.InFlight)
		}
		resp.Body.Close()
		req, _ = http.NewRequestWithContext(t.Context(), "POST", "http://api.test/stream", nil)
		resp, err = tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if s, _ := tr.Stats().Lane("api.test"); s.InFlight != 1 {
			t.Errorf("stream by default: %d in flight before its first event, want 1", s.InFlight)
		}
		if _, err := resp.Body.Read(make([]byte, 64)); err != nil { // the first event
			t.Fatal(err)
		}
		if s, _ := tr.Stats().Lane("api.test"); s.InFlight != 0 {
			t.Errorf("stream by default: %d in flight after its first event, want 0", s.InFlight)
		}
	})
}

// TestHeldStreamsDoNotStarveQuickCalls: on a lane paced at 10/s, six
// callers hold streams of a minute (HoldStream) while four make quick
// calls of 200 ms. A held stream outlasts the latency of the quick calls
// by far: its slot is counted beside the limit that Little's law sizes
// for them, and the quick calls keep the rate the streams leave. (Sized
// by the recent latency alone, the limit left the streams every slot, and
// the quick calls got none in most quarters of a minute.)
func TestHeldStreamsDoNotStarveQuickCalls(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := rtFunc(func(req *http.Request) (*http.Response, error) {
			if strings.HasSuffix(req.URL.Path, "/stream") {
				time.Sleep(300 * time.Millisecond)
				return &http.Response{StatusCode: 200, Header: http.Header{"Content-Type": {"text/event-stream"}},
					Body: &sseBody{n: 2, interval: time.Minute}, Request: req}, nil
			}
			time.Sleep(200 * time.Millisecond)
			return &http.Response{StatusCode: 200, Header: http.Header{}, Body: io.NopCloser(strings.NewReader("ok")), Request: req}, nil
		})
		tr := mustNew(t, base, WithRetry(0), WithRate(600, time.Minute))
		ctx, cancel := context.WithCancel(t.Context())
		var quick atomic.Int64
		call := func(ctx context.Context, path string) error { return postPath(ctx, tr, path) }
		var wg sync.WaitGroup
		quickCallers(ctx, &wg, 4, call, &quick)
		for range 6 {
			wg.Go(func() {
				for ctx.Err() == nil {
					call(HoldStream(ctx), "/stream")
				}
			})
		}
		time.Sleep(time.Minute)
		from := quick.Load()
		const d = 4 * time.Minute
		time.Sleep(d)
		got := float64(quick.Load()-from) / d.Seconds()
		cancel()
		wg.Wait()
		t.Logf("quick calls: %.2f/s beside six held streams, at 10/s", got)
		// The streams take one token a minute each: 0.1/s.
		if got < 0.9*(10-0.1) {
			t.Errorf("quick calls served at %.2f/s, want the rate the streams leave (9.9/s) within 10%%", got)
		}
	})
}

// TestStreamRefusalAfterItsLaneWasForgotten: a stream whose context has
// ended gives its slot back, so its lane may be forgotten while the caller
// holds it unread. A first event read after that, one that says the
// caller is rate-limited, is the live lane's to learn: it counts the
// refusal.
func TestStreamRefusalAfterItsLaneWasForgotten(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := mustNew(t, sseRefusing, WithLaneIdle(time.Minute), WithRetry(0))
		ctx, cancel := context.WithCancel(t.Context())
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://api.test/v1/messages", nil)
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		cancel() // the caller gave up on the stream, and reads it later
		old := tr.find("api.test")
		time.Sleep(3 * time.Minute) // idle: the sweep forgets the lane
		if tr.find("api.test") == old {
			t.Fatal("the idle lane was not forgotten")
		}
		io.Copy(io.Discard, resp.Body) // the refusal, read now
		resp.Body.Close()
		ls, ok := tr.LaneStats("api.test")
		if !ok || ls.Levels[Normal].Throttled != 1 {
			t.Errorf("the live lane after the stream's refusal: found %v, throttled %d; want 1", ok, ls.Levels[Normal].Throttled)
		}
	})
}

// TestHeldStreamsTurnLongAsLatencyFalls: a paced lane (10/s, at most 8 in
// flight) first learns a latency of 20 s, so the dispatcher, finding every
// slot taken by slow calls, notes that nothing may turn long for a minute
// (W + 4D). The calls then take 200 ms and six callers hold streams of
// minutes (HoldStream): the streams outlast W + 4D within a second, and
// must be counted beside the limit: the look for long attempts follows
// the outlier time as it shrinks, or the quick calls get nothing until
// the instant the old one set, about 40 s.
func TestHeldStreamsTurnLongAsLatencyFalls(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := rtFunc(func(req *http.Request) (*http.Response, error) {
			switch {
			case strings.HasSuffix(req.URL.Path, "/stream"):
				time.Sleep(300 * time.Millisecond)
				return &http.Response{StatusCode: 200, Header: http.Header{"Content-Type": {"text/event-stream"}},
					Body: &sseBody{n: 2, interval: 2 * time.Minute}, Request: req}, nil
			case strings.HasSuffix(req.URL.Path, "/slow"):
				time.Sleep(20 * time.Second)
			default:
				time.Sleep(200 * time.Millisecond)
			}
			return &http.Response{StatusCode: 200, Header: http.Header{}, Body: io.NopCloser(strings.NewReader("ok")), Request: req}, nil
		})
		tr := mustNew(t, base, WithRetry(0), WithRate(600, time.Minute), WithConcurrency(1, 8))
		ctx, cancel := context.WithCancel(t.Context())
		call := func(ctx context.Context, path string) error { return postPath(ctx, tr, path) }
		if err := call(ctx, "/slow"); err != nil { // W = 20 s, W + 4D = 60 s
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() { call(ctx, "/slow") })
		}
		var quick atomic.Int64
		quickCallers(ctx, &wg, 4, call, &quick)
		time.Sleep(21 * time.Second)
		for range 6 {
			wg.Go(func() {
				for ctx.Err() == nil {
					call(HoldStream(ctx), "/stream")
				}
			})
		}
		time.Sleep(10 * time.Second)
		from := quick.Load()
		const d = 30 * time.Second
		time.Sleep(d)
		got := float64(quick.Load()-from) / d.Seconds()
		cancel()
		wg.Wait()
		if got < 8 {
			t.Errorf("quick calls at %.2f/s beside six held streams, want about 10/s", got)
		}
	})
}

// postPath posts to path on api.test through rt and reads the answer's
// body to its end.
func postPath(ctx context.Context, rt http.RoundTripper, path string) error {
	req, _ := http.NewRequestWithContext(ctx, "POST", "http://api.test"+path, nil)
	resp, err := rt.RoundTrip(req)
	if err != nil {
		return err
	}
	io.Copy(io.Discard, resp.Body)
	return resp.Body.Close()
}

// quickCallers starts n callers on wg that call /quick until ctx ends,
// counting in served the calls that were.
func quickCallers(ctx context.Context, wg *sync.WaitGroup, n int, call func(context.Context, string) error, served *atomic.Int64) {
	for range n {
		wg.Go(func() {
			for ctx.Err() == nil {
				if call(ctx, "/quick") == nil {
					served.Add(1)
				}
			}
		})
	}
}

// TestLongCallsLeaveTheGradientAlone: a lane paced at 30/s with at most 8
// calls in flight (WithConcurrency(1, 8)); four callers make calls of a
// minute (held streams, or plain long calls), started together, and eight
// make calls of 200 ms. The quick calls have the 4 slots the long ones
// leave: 20/s. The long calls' samples are left out of the gradient's
// window while they are a minority: in its mean, a few samples of 60 s
// among calls of 200 ms would read, at a completion rate under the rate
// with every slot taken, as the upstream queueing, and cap the limit at 1
// for minutes.
func TestLongCallsLeaveTheGradientAlone(t *testing.T) {
	for _, held := range []bool{true, false} {
		name := "plain long calls"
		if held {
			name = "held streams"
		}
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				base := rtFunc(func(req *http.Request) (*http.Response, error) {
					switch {
					case strings.HasSuffix(req.URL.Path, "/stream"):
						time.Sleep(200 * time.Millisecond)
						return &http.Response{StatusCode: 200, Header: http.Header{"Content-Type": {"text/event-stream"}},
							Body: &sseBody{n: 2, interval: time.Minute}, Request: req}, nil
					case strings.HasSuffix(req.URL.Path, "/slow"):
						time.Sleep(time.Minute)
					default:
						time.Sleep(200 * time.Millisecond)
					}
					return &http.Response{StatusCode: 200, Header: http.Header{}, Body: io.NopCloser(strings.NewReader("ok")), Request: req}, nil
				})
				tr := mustNew(t, base, WithRetry(0), WithRate(30, time.Second), WithConcurrency(1, 8))
				ctx, cancel := context.WithCancel(t.Context())
				var quick atomic.Int64
				call := func(ctx context.Context, path string) error { return postPath(ctx, tr, path) }
				var wg sync.WaitGroup
				quickCallers(ctx, &wg, 8, call, &quick)
				for range 4 {
					wg.Go(func() {
						for ctx.Err() == nil {
							if held {
								call(HoldStream(ctx), "/stream")
							} else {
								call(ctx, "/slow")
							}
						}
					})
				}
				time.Sleep(time.Minute)
				from := quick.Load()
				var limits []int
				saturated := 0
				const d = 4 * time.Minute
				for range int(d / (10 * time.Second)) {
					time.Sleep(10 * time.Second)
					s, _ := tr.LaneStats("api.test")
					limits = append(limits, s.Limit)
					if s.Saturated {
						saturated++
					}
				}
				got := float64(quick.Load()-from) / d.Seconds()
				cancel()
				wg.Wait()
				t.Logf("held %v: quick calls %.2f/s; limit every 10 s %v; saturated in %d of %d looks", held, got, limits, saturated, len(limits))
				if got < 0.9*20 {
					t.Errorf("held %v: quick calls at %.2f/s beside 4 calls of a minute, want the 4 slots they leave (20/s) within 10%%", held, got)
				}
			})
		})
	}
}
