package sluice

import (
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// coolingHost answers /status with a 503 and Retry-After: 5 (the host
// cools down for 5 s), and any other path with a 200 after 100 ms,
// recording when each such call arrived, and in what order, by its
// X-Class.
func coolingHost(mu *sync.Mutex, at map[string]time.Time, order *[]string) http.RoundTripper {
	return rtFunc(func(r *http.Request) (*http.Response, error) {
		switch r.URL.Path {
		case "/slow":
			time.Sleep(3 * time.Second)
			fallthrough
		case "/status":
			return &http.Response{StatusCode: 503, Header: http.Header{"Retry-After": {"5"}}, Body: http.NoBody, Request: r}, nil
		}
		mu.Lock()
		at[r.Header.Get("X-Class")] = time.Now()
		*order = append(*order, r.Header.Get("X-Class"))
		mu.Unlock()
		time.Sleep(100 * time.Millisecond)
		return &http.Response{StatusCode: 200, Header: http.Header{}, Body: io.NopCloser(strings.NewReader("ok")), Request: r}, nil
	})
}

// sendModel makes a request of class at level p through tr, on the
// sub-limit sub if it is not empty, and reads its body.
func sendModel(t *testing.T, tr http.RoundTripper, p Priority, sub, class string) {
	ctx := WithPriority(t.Context(), p)
	if sub != "" {
		ctx = WithSublimit(ctx, sub)
	}
	if err := get(ctx, tr, class); err != nil {
		t.Errorf("%s: %v", class, err)
	}
}

// TestSublimitPriorityAfterHostCooldown: six Batch requests of a
// sub-limit (a model, paced at 1/s) wait out a 5 s cooldown of their
// host, and an Interactive one of the same model comes a second later.
// The sub-limit holds its waiters in its queue until the host opens, so
// the Interactive request goes first, as it does with no sub-limit. The
// order the waiters' goroutines wake in varies, so the scenario runs
// eight times.
func TestSublimitPriorityAfterHostCooldown(t *testing.T) {
	for _, sub := range []string{"", "m"} {
		t.Run("sub="+sub, func(t *testing.T) {
			for run := range 8 {
				synctest.Test(t, func(t *testing.T) {
					var mu sync.Mutex
					at := map[string]time.Time{}
					var order []string
					tr := mustNew(t, coolingHost(&mu, at, &order), WithRetry(0), WithRate(10, time.Second), WithBurst(1),
						WithSublimitRate("m", 1, time.Second))
					defer tr.Close()
					t0 := time.Now()
					call(t.Context(), tr, "http://api.test/status") // the host cools for 5 s
					var wg sync.WaitGroup
					for i := range 6 {
						wg.Go(func() { sendModel(t, tr, Batch, sub, "b"+string(rune('0'+i))) })
						time.Sleep(10 * time.Millisecond)
					}
					time.Sleep(time.Second)
					wg.Go(func() { sendModel(t, tr, Interactive, sub, "I") })
					wg.Wait()
					mu.Lock()
					defer mu.Unlock()
					for c, a := range at {
						if a.Before(at["I"]) {
							t.Errorf("run %d: sent in order %v: Batch %s sent at %v, before the Interactive request, waiting since 1 s, at %v",
								run, order, c, a.Sub(t0), at["I"].Sub(t0))
						}
					}
				})
			}
		})
	}
}

// TestSublimitNoBurstWhenHostCoolsWhileQueued: a sub-limit paced at 1/s
// has requests queued when its host begins a 5 s cooldown. The sub-limit
// grants nothing until the host opens, and then goes on at its pace: no
// grants made meanwhile wait at the host to go out at once when it opens.
func TestSublimitNoBurstWhenHostCoolsWhileQueued(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		at := map[string]time.Time{}
		var order []string
		tr := mustNew(t, coolingHost(&mu, at, &order), WithRetry(0), WithBurst(1), WithSublimitRate("m", 1, time.Second))
		defer tr.Close()
		t0 := time.Now()
		var wg sync.WaitGroup
		for i := range 6 {
			wg.Go(func() { sendModel(t, tr, Normal, "m", "n"+string(rune('0'+i))) })
		}
		time.Sleep(1500 * time.Millisecond)
		call(t.Context(), tr, "http://api.test/status") // the host cools for 5 s
		wg.Wait()
		mu.Lock()
		defer mu.Unlock()
		var ts []time.Time
		for _, c := range order {
			ts = append(ts, at[c])
		}
		var offs []time.Duration
		for _, s := range ts {
			offs = append(offs, s.Sub(t0))
		}
		t.Logf("model calls sent at %v", offs)
		for i := 1; i < len(ts); i++ {
			if gap := ts[i].Sub(ts[i-1]); gap < 500*time.Millisecond {
				t.Errorf("model calls %d and %d sent %v apart, under the sub-limit's pace of 1/s", i-1, i, gap)
			}
		}
	})
}

// TestSublimitKeepsItsPlaceAtTheHost: the host cools down for 5 s.
// Five Normal requests of a sub-limit (a model, paced at 100/s) come at
// once, and five Normal requests with no sub-limit a second later. The
// model's requests wait out the cooldown in the sub-limit's queue (it
// holds its waiters until the host opens), and are filed at the host by
// when they came: within one level the order is FIFO, the model's five
// first. The host may grant one request already in its queue at the
// instant it opens, before the sub-limit's reach it.
func TestSublimitKeepsItsPlaceAtTheHost(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		at := map[string]time.Time{}
		var order []string
		tr := mustNew(t, coolingHost(&mu, at, &order), WithRetry(0), WithRate(10, time.Second), WithBurst(1),
			WithSublimitRate("m", 100, time.Second))
		defer tr.Close()
		call(t.Context(), tr, "http://api.test/status") // the host cools for 5 s
		modelsThenHost(t, tr, &mu, &order)
	})
}

// modelsThenHost sends five Normal requests of the sub-limit "m" through
// tr at once and five with no sub-limit a second later, waits for them,
// and checks that at most one of the later ones went before one of the
// model's (see TestSublimitKeepsItsPlaceAtTheHost); order is what the
// base saw, under mu.
func modelsThenHost(t *testing.T, tr http.RoundTripper, mu *sync.Mutex, order *[]string) {
	t.Helper()
	var wg sync.WaitGroup
	for i := range 5 {
		wg.Go(func() { sendModel(t, tr, Normal, "m", "m"+string(rune('0'+i))) })
	}
	time.Sleep(time.Second)
	for i := range 5 {
		wg.Go(func() { sendModel(t, tr, Normal, "", "h"+string(rune('0'+i))) })
	}
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	t.Logf("sent in order %v", *order)
	if n := overtaking(*order); n > 1 {
		t.Errorf("%d requests that came a second after the model's five went before one of them: order %v", n, *order)
	}
}

// overtaking returns how many of the host's requests ("h...") in order went
// before the model's last ("m...").
func overtaking(order []string) int {
	n, last := 0, 0
	for _, c := range order {
		if c[0] == 'h' {
			n++
		} else {
			last = n
		}
	}
	return last
}

// TestSublimitKeepsItsPlaceWhenTheCooldownGrows: as
// TestSublimitKeepsItsPlaceAtTheHost, but the host's cooldown grows while
// the model's requests wait for it: a call sent before it answers 503
// with a longer Retry-After 3 s in. The model's requests, granted by the
// sub-limit when the first cooldown ends, go back to its queue for the
// second, and are still filed at the host by when they first came, ahead
// of the requests that came a second after them.
func TestSublimitKeepsItsPlaceWhenTheCooldownGrows(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		var order []string
		tr := mustNew(t, coolingHost(&mu, map[string]time.Time{}, &order), WithRetry(0), WithRate(10, time.Second), WithBurst(1),
			WithSublimitRate("m", 100, time.Second))
		defer tr.Close()
		var wg sync.WaitGroup
		defer wg.Wait()
		wg.Go(func() { call(t.Context(), tr, "http://api.test/slow") }) // at 3 s: the host cools until 8 s
		time.Sleep(10 * time.Millisecond)
		call(t.Context(), tr, "http://api.test/status") // the host cools until about 5 s
		modelsThenHost(t, tr, &mu, &order)
	})
}
