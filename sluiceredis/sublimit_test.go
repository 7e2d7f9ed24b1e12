package sluiceredis

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/sluice-go/sluice"
)

// TestSublimitRateShared: two processes (each a Backend and a Transport of
// its own, on one redis-server) that give a model's sub-limit its rate
// (WithSublimitRate) draw on one allowance for it: together they send the
// model's rate, not twice it, while the host's much higher rate binds
// neither, and keep within the fleet's bound. Each process's callers
// want far more than the rate.
func TestSublimitRateShared(t *testing.T) {
	srv := startRedis(t)
	const modelRate, run, warm = 40, 4 * time.Second, 2 * time.Second
	var mu sync.Mutex
	var arrivals []time.Time
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		arrivals = append(arrivals, time.Now())
		mu.Unlock()
	}))
	defer up.Close()

	// Beside them, over the same window: x/time/rate at the model's rate,
	// with as many workers; a runner that stalls stalls both.
	peer := startPeer(modelRate, sluice.DefaultBurst, 16, warm, warm+run)
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), warm+run)
	defer cancel()
	var wg sync.WaitGroup
	for range 2 {
		b := newBackend(t, newClient(t, srv.Addr()), WithRefresh(250*time.Millisecond))
		tr, err := sluice.New(nil, sluice.WithRate(1000, time.Second), sluice.WithBackend(b), sluice.WithRetry(0),
			sluice.WithSublimitRate("gpt-4o", modelRate, time.Second))
		if err != nil {
			t.Fatal(err)
		}
		defer tr.Close()
		mctx := sluice.WithSublimit(ctx, "gpt-4o")
		for range 8 {
			wg.Go(func() {
				for mctx.Err() == nil {
					req, _ := http.NewRequestWithContext(mctx, "GET", up.URL, nil)
					if resp, err := tr.RoundTrip(req); err == nil {
						resp.Body.Close()
					}
				}
			})
		}
	}
	wg.Wait()
	peerGot := peer() / modelRate
	mu.Lock()
	defer mu.Unlock()
	var measured []time.Time
	for _, at := range arrivals {
		if at.Sub(start) >= warm {
			measured = append(measured, at)
		}
	}
	got := float64(len(measured)) / run.Seconds() / modelRate
	t.Logf("two processes, the model's sub-limit at %d/s: %.3f of its rate together (the peer %.3f)", modelRate, got, peerGot)
	// Shared, the two send the model's rate; each on its own, twice it.
	if got > 1.15 {
		t.Errorf("two processes sent %.3f of the model's rate together; want about 1 (2 if each spent it alone)", got)
	}
	if got < 0.9*peerGot {
		t.Errorf("two processes sent %.3f of the model's rate together, under 0.9 of the peer's %.3f", got, peerGot)
	}
	checkBound(t, measured, modelRate, sluice.DefaultBurst, 2, 250*time.Millisecond, time.Second)
}
