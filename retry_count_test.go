package sluice

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"runtime/debug"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// TestRetriesCounterNeverFalls: LaneStats counters count since the lane
// was created, and never fall (the exporters take a fall for a new lane):
// a retry abandoned in its backoff is not counted among those sent, before
// nor after.
func TestRetriesCounterNeverFalls(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var n atomic.Int32
		base := &fakeBase{answer: func(*http.Request) *http.Response {
			if n.Add(1) == 1 {
				return &http.Response{StatusCode: 500, Header: http.Header{}, Body: http.NoBody} // retried after a backoff
			}
			return &http.Response{StatusCode: 200, Header: http.Header{}, Body: io.NopCloser(strings.NewReader("ok"))}
		}}
		tr, err := New(base)
		if err != nil {
			t.Fatal(err)
		}
		defer tr.Close()
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error)
		go func() {
			req, _ := http.NewRequestWithContext(ctx, "GET", "http://api.example.com/x", nil)
			_, err := tr.RoundTrip(req)
			done <- err
		}()
		synctest.Wait() // in the retry's backoff
		during, _ := tr.LaneStats("api.example.com")
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Fatalf("RoundTrip: %v", err)
		}
		after, _ := tr.LaneStats("api.example.com")
		t.Logf("during %d after %d calls %d", during.Retries, after.Retries, n.Load())
		if after.Retries < during.Retries {
			t.Errorf("LaneStats.Retries went from %d to %d on a live lane (Made %v, then %v): a counter must not fall",
				during.Retries, after.Retries, during.Made, after.Made)
		}
	})
}

// TestRetryTakenBackOnItsLane: a retry counted by lane A's budget whose
// lane is forgotten during the backoff goes to the key's new lane B; B
// refuses it, and the budget count is taken back on A, which counted it,
// not on B, which has no window of retries.
func TestRetryTakenBackOnItsLane(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var failed atomic.Bool
		base := &fakeBase{answer: func(req *http.Request) *http.Response {
			if req.Header.Get("Fail") != "" && failed.CompareAndSwap(false, true) {
				return &http.Response{StatusCode: 500, Header: http.Header{}, Body: http.NoBody}
			}
			if req.Header.Get("Slow") != "" {
				time.Sleep(5 * time.Second)
			}
			return &http.Response{StatusCode: 200, Header: http.Header{}, Body: io.NopCloser(strings.NewReader("ok"))}
		}}
		tr, err := New(base, WithLaneIdle(20*time.Millisecond), WithConcurrency(1, 1), WithMaxQueue(1),
			WithBackoff(func(_, _ time.Duration, _ int, _ *http.Response) time.Duration { return 200 * time.Millisecond }))
		if err != nil {
			t.Fatal(err)
		}
		defer tr.Close()
		send := func(h string) (err error) {
			defer func() {
				if r := recover(); r != nil {
					err = fmt.Errorf("RoundTrip panicked: %v\n%s", r, debug.Stack())
				}
			}()
			req, _ := http.NewRequest("GET", "http://api.example.com/x", nil)
			if h != "" {
				req.Header.Set(h, "1")
			}
			resp, err := tr.RoundTrip(req)
			if err == nil {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
			return err
		}
		first := make(chan error, 1)
		go func() { first <- send("Fail") }() // 500, then a 200 ms backoff
		time.Sleep(100 * time.Millisecond)    // the lane, idle, is forgotten meanwhile
		synctest.Wait()
		go send("Slow") // a new lane for the key; takes its one slot
		synctest.Wait()
		go send("Slow") // waits: the queue is full
		synctest.Wait()
		err = <-first // its retry finds the new lane's queue full
		ls, _ := tr.LaneStats("api.example.com")
		t.Logf("first request: %v; Retries now %d", err, ls.Retries)
		if err != nil && strings.Contains(err.Error(), "panicked") {
			t.Error(err)
		}
		if ls.Retries > 1 {
			t.Errorf("LaneStats.Retries = %d", ls.Retries)
		}
		time.Sleep(11 * time.Second)
	})
}

// TestRefusedRetryTakenBackWithoutKept: a retry the lane refuses is
// taken back from the retry budget whether or not the answer that caused
// it could be kept (here a 500 whose body is over 64 KiB).
func TestRefusedRetryTakenBackWithoutKept(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		big := strings.Repeat("x", drainLimit+10)
		var fails atomic.Int32
		base := &fakeBase{answer: func(req *http.Request) *http.Response {
			class := req.Header.Get("X-Class")
			if class == "fail" && fails.Add(1) == 1 {
				return &http.Response{StatusCode: 500, Header: http.Header{}, Body: io.NopCloser(strings.NewReader(big))}
			}
			if class == "fail" {
				return &http.Response{StatusCode: 500, Header: http.Header{}, Body: http.NoBody}
			}
			if class == "slow" {
				time.Sleep(2 * time.Second)
			}
			return &http.Response{StatusCode: 200, Header: http.Header{}, Body: io.NopCloser(strings.NewReader("ok"))}
		}}
		tr := mustNew(t, base, WithConcurrency(1, 1), WithMaxQueue(1), WithRetry(1), WithRetryBudget(0, 1),
			WithBackoff(func(_, _ time.Duration, _ int, _ *http.Response) time.Duration { return 200 * time.Millisecond }))
		defer tr.Close()
		ctx := context.Background()
		first := make(chan error, 1)
		go func() { first <- get(ctx, tr, "fail") }() // 500 with a long body, then a 200 ms backoff
		time.Sleep(100 * time.Millisecond)
		go get(ctx, tr, "slow") // takes the one slot
		synctest.Wait()
		go get(ctx, tr, "slow") // waits: the queue is full
		synctest.Wait()
		if err := <-first; !errors.Is(err, ErrRejected) {
			t.Fatalf("first request: %v, want its retry refused", err)
		}
		time.Sleep(5 * time.Second) // the slow ones are done; within the budget's window still
		if err := get(ctx, tr, "fail"); err != nil {
			t.Fatal(err)
		}
		ls, _ := tr.LaneStats("api.test")
		if ls.RetriesDenied != 0 || ls.Retries != 1 {
			t.Errorf("retries made %d, denied %d; want 1 made: the refused retry, never sent, is taken back", ls.Retries, ls.RetriesDenied)
		}
	})
}
