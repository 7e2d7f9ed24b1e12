package sluice

import (
	"context"
	"io"
	"math/rand/v2"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// shortBase answers after a random short delay, or fails with the
// request's context.
type shortBase struct{}

func (shortBase) RoundTrip(req *http.Request) (*http.Response, error) {
	d := time.Duration(rand.IntN(300)) * time.Microsecond
	select {
	case <-time.After(d):
	case <-req.Context().Done():
		return nil, req.Context().Err()
	}
	return &http.Response{StatusCode: 200, Header: http.Header{}, Request: req,
		Body: io.NopCloser(strings.NewReader(strings.Repeat("x", 64)))}, nil
}

// stressHolds sends requests from 24 goroutines through a Transport with
// opts, ending each in one of the ways a caller can: read and closed,
// cancelled while at the base, given up with the body closed later, dropped
// with its context ended or alive, read and closed at once from two
// goroutines; Stats reclaims meanwhile. It returns the Transport once all
// are done and collected.
func stressHolds(t *testing.T, opts ...Option) *Transport {
	tr := mustNew(t, shortBase{}, opts...)
	var stop atomic.Bool
	var sg sync.WaitGroup
	sg.Add(1)
	go func() { // Stats reclaims
		defer sg.Done()
		for !stop.Load() {
			tr.Stats()
			time.Sleep(50 * time.Microsecond)
		}
	}()
	var wg sync.WaitGroup
	var kept sync.Map
	for g := range 24 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 150 {
				ctx, cancel := context.WithTimeout(context.Background(), time.Duration(rand.IntN(3000))*time.Microsecond+100*time.Microsecond)
				if g%3 == 0 {
					ctx = WithTenant(ctx, "t"+string(rune('a'+g%4)))
				}
				req, _ := http.NewRequestWithContext(ctx, "GET", "http://api.test/", nil)
				mode := rand.IntN(6)
				if mode == 1 {
					go func() { time.Sleep(time.Duration(rand.IntN(200)) * time.Microsecond); cancel() }()
				}
				resp, err := tr.RoundTrip(req)
				if err != nil {
					cancel()
					continue
				}
				switch mode {
				case 0, 1:
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				case 2: // give up, keep the body a while, then close it
					cancel()
					kept.Store([2]int{g, i}, resp)
					go func() {
						time.Sleep(time.Duration(rand.IntN(2000)) * time.Microsecond)
						resp.Body.Close()
					}()
				case 3: // give up and drop
					cancel()
				case 4: // drop with a live context (until its timeout)
				case 5: // read and close at once from two goroutines
					go resp.Body.Close()
					io.Copy(io.Discard, resp.Body)
				}
				if mode != 4 {
					cancel()
				} else {
					defer cancel()
				}
			}
		}()
	}
	wg.Wait()
	time.Sleep(10 * time.Millisecond)
	for range 5 {
		runtime.GC()
		time.Sleep(5 * time.Millisecond)
	}
	stop.Store(true)
	sg.Wait()
	return tr
}

// checkHeld fails t unless the lane of tr comes back whole: no slot in
// use, no hold held, nobody queued, no tenant with anything in flight.
func checkHeld(t *testing.T, tr *Transport) {
	t.Helper()
	v, ok := tr.lanes.Load("api.test")
	if !ok {
		t.Fatal("no lane")
	}
	l := v.(*lane)
	deadline := time.Now().Add(2 * time.Second)
	for {
		runtime.GC()
		l.lock()
		l.reclaimLocked(false)
		inUse, held, q := l.slot.inUse, len(l.held), l.q.len()
		tin := 0
		for p := range l.q.levels {
			l.q.levels[p].each(func(tn *tenant) { tin += tn.inFlight })
		}
		l.unlock()
		if inUse == 0 && held == 0 && q == 0 && tin == 0 {
			return
		}
		if inUse != held {
			t.Fatalf("slot.inUse %d != len(held) %d", inUse, held)
		}
		if time.Now().After(deadline) {
			t.Fatalf("in use %d, held %d, queued %d, tenants in flight %d", inUse, held, q, tin)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestHoldStress: every way a response can end gives its slot back once,
// on a lane that times every attempt and on one that times few (whose
// owners give most slots back without the lock: see lane.listReturned).
func TestHoldStress(t *testing.T) {
	for range 3 {
		tr := stressHolds(t, WithConcurrency(2, 2), WithTenantShare(Normal, 0.5))
		checkHeld(t, tr)
		tr = stressHolds(t, WithConcurrency(2, 2), WithRate(1e6, time.Second), WithBurst(1000))
		checkHeld(t, tr)
	}
}

// TestReturnedSettled: holds given back without the lock (see
// lane.listReturned) are settled by the time the lock is free, with no
// later lock to settle them, and each wakes the waiters its slot serves:
// eight goroutines on a lane of one or two slots, paced too fast to time
// every attempt, all finish, and the idle lane lists nothing, with every
// slot free. Ten rounds each: a hold left listed shows in some.
func TestReturnedSettled(t *testing.T) {
	for i := range 20 {
		slots := 1 + i%2
		tr := mustNew(t, replyBase{}, WithConcurrency(slots, slots), WithRate(1e6, time.Second), WithBurst(1000))
		reqs := costRequests(t, 8, false)
		done := make(chan struct{})
		go func() {
			defer close(done)
			var wg sync.WaitGroup
			for _, req := range reqs {
				wg.Go(func() {
					for range 2000 {
						resp, err := tr.RoundTrip(req)
						if err != nil {
							t.Error(err)
							return
						}
						io.Copy(io.Discard, resp.Body)
						resp.Body.Close()
					}
				})
			}
			wg.Wait()
		}()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Fatalf("%d slots: requests still waiting after 30 s: a slot given back woke nobody", slots)
		}
		l := tr.lane("api.test")
		l.mu.Lock() // not lock: that would settle what is listed
		// Prepaid grants left hold their slots until someone comes, and
		// while they are left, returns wait for the lock's next holder:
		// every other slot in use is a hold listed.
		left := int(l.fast.Load() & fastMask)
		listed := 0
		for h := l.returned.Load(); h != nil; h = h.next {
			listed++
		}
		inUse := l.slot.inUse
		l.mu.Unlock()
		if left == 0 && listed > 0 || inUse-left != listed {
			t.Errorf("%d slots: idle lane: %d holds still listed, %d grants prepaid, %d slots in use", slots, listed, left, inUse)
		}
	}
}

// TestHoldStressBackend: the same with a Backend, whose leases all come back.
func TestHoldStressBackend(t *testing.T) {
	mb := newMemBackend()
	tr := stressHolds(t, WithConcurrency(2, 2), WithBackend(mb))
	checkHeld(t, tr)
	time.Sleep(20 * time.Millisecond)
	mb.mu.Lock()
	defer mb.mu.Unlock()
	if mb.leases["api.test"] != 0 {
		t.Errorf("backend leases %d (granted %d, dones %d)", mb.leases["api.test"], mb.granted, mb.dones)
	}
}
