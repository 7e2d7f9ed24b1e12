package sluice

import (
	"context"
	"errors"
	"math"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// bucketServer models a token budget as a refilling bucket of size at
// rate a second: each arrival takes its X-Cost if the bucket holds it (else
// 429), and its answer states what remained at its arrival. A request
// with X-Hold is answered only once hold[name] is closed: a slow call.
type bucketServer struct {
	mu      sync.Mutex
	size    float64
	rate    float64
	level   float64
	at      time.Time
	refused int
	hold    map[string]chan struct{}
}

func (s *bucketServer) RoundTrip(req *http.Request) (*http.Response, error) {
	cost, _ := strconv.Atoi(req.Header.Get("X-Cost"))
	s.mu.Lock()
	now := time.Now()
	if !s.at.IsZero() {
		s.level = min(s.size, s.level+now.Sub(s.at).Seconds()*s.rate)
	}
	s.at = now
	status := 200
	if float64(cost) > s.level {
		s.refused++
		status = http.StatusTooManyRequests
	} else {
		s.level -= float64(cost)
	}
	left := int(s.level)
	ch := s.hold[req.Header.Get("X-Hold")]
	s.mu.Unlock()
	if ch != nil {
		<-ch
	}
	h := http.Header{}
	h.Set("X-Ratelimit-Limit-Tokens", strconv.Itoa(int(s.size)))
	h.Set("X-Ratelimit-Remaining-Tokens", strconv.Itoa(left))
	h.Set("X-Ratelimit-Reset-Tokens", "1m0s")
	if status == http.StatusTooManyRequests {
		h.Set("Retry-After", "1")
	}
	return &http.Response{StatusCode: status, Header: h, Body: http.NoBody, Request: req}, nil
}

// TestBudgetSlowCallCount: a budget of 6,000 tokens a minute (100/s). A
// (1,000) is sent at 0 and answered at 120 s, its count (5,000 remain)
// taken at its arrival. B (6,000) goes at 110 s, when the bucket is full
// again, and empties it. At 120 s the server holds 1,000, and so does the
// lane: the server's bucket gained no refill while it was full, and adding
// the 12,000 of refill over A's 120 s to A's 5,000 would read it as full
// and send a call of 6,000 that the server refuses.
func TestBudgetSlowCallCount(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &bucketServer{size: 6000, rate: 100, level: 6000, hold: map[string]chan struct{}{"a": make(chan struct{})}}
		tr := mustNew(t, srv, WithRetry(0), WithBudget("tokens", 6000, time.Minute))
		defer tr.Close()
		var wg sync.WaitGroup
		defer wg.Wait()
		wg.Go(func() { sendTokens(t.Context(), tr, 1000, "a") })
		synctest.Wait()
		time.Sleep(110 * time.Second)
		if resp, err := sendTokens(t.Context(), tr, 6000, ""); err != nil || resp.StatusCode != 200 {
			t.Fatalf("B: %v %v", resp, err)
		}
		time.Sleep(10 * time.Second)
		close(srv.hold["a"])
		synctest.Wait()
		if got := laneLevel(tr, "api.test"); got > 1000+1 {
			t.Errorf("after A's count: lane holds %v tokens, the server 1000", got)
		}
		resp, err := sendTokens(t.Context(), tr, 6000, "")
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode == http.StatusTooManyRequests {
			t.Errorf("sent a call of 6,000 tokens with the server at about 1,000: refused")
		}
	})
}

// TestEarlyRefusalCountsTheMargin: the lane learned a margin of 1 (a call
// estimated at 1,000 cost 4,000) and holds the server's 1,000 of a budget
// of 6,000 a minute (100/s). A call of 1,000 then waits for 2,000 held, 10
// s away: one with a deadline of 5 s cannot be served in time and is
// refused at once, not estimated without the margin (0 s away) and left to
// fail at its deadline.
func TestEarlyRefusalCountsTheMargin(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		remaining := "5000"
		base := tokensLeft(&remaining)
		tr := mustNew(t, base, WithBudget("tokens", 6000, time.Minute))
		if err := getCost(t.Context(), tr, 3000, ""); err != nil {
			t.Fatal(err)
		}
		remaining = "1000"
		if err := getCost(t.Context(), tr, 1000, ""); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		defer cancel()
		start := time.Now()
		err := getCost(ctx, tr, 1000, "")
		if !errors.Is(err, ErrRejected) {
			t.Errorf("a call that waits 10 s for the budget, with a deadline of 5 s: %v after %v, want an early refusal", err, time.Since(start))
		}
	})
}

// TestCostRefusalOfAHugeCost: a cost past any budget is refused,
// and the error states it, not a negative number.
func TestCostRefusalOfAHugeCost(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := mustNew(t, &fakeBase{}, WithBudget("tokens", 6000, time.Minute))
		err := getCost(t.Context(), tr, math.MaxInt, "")
		var rej *RejectedError
		if !errors.As(err, &rej) || rej.Cost <= 6000 {
			t.Errorf("refusal of a cost of MaxInt: %v (Cost %d)", err, rej.Cost)
		}
	})
}
