package sluice

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// TestQueueStressCapsAndCancels: 400 requests of random levels and
// tenants, under tenant caps, queue bounds, aging and a limit moved at
// random, a quarter with deadlines and a quarter cancelled: once every one
// has returned, nothing is left queued or in flight, and no tenant record
// is left. 40 seeds.
func TestQueueStressCapsAndCancels(t *testing.T) {
	for seed := range uint64(40) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				r := rand.New(rand.NewPCG(seed, 7))
				var rmu sync.Mutex
				rnd := func(n int) int { rmu.Lock(); defer rmu.Unlock(); return r.IntN(n) }
				base := rtFunc(func(req *http.Request) (*http.Response, error) {
					time.Sleep(time.Duration(1+rnd(50)) * time.Millisecond)
					return &http.Response{StatusCode: 200, Body: http.NoBody, Request: req}, nil
				})
				opts := []Option{WithConcurrency(1, 12), WithTenantShare(Normal, 0.3), WithTenantShare(Batch, 0.1), WithTenantQueue(50), WithMaxQueue(300)}
				if seed%2 == 0 {
					opts = append(opts, WithRate(200, time.Second))
				}
				if seed%3 == 0 {
					opts = append(opts, WithAging(100*time.Millisecond))
				}
				tr := mustNew(t, base, opts...)
				l := tr.lane("api.test")
				var wg sync.WaitGroup
				for i := range 400 {
					p := Priority(rnd(3))
					id := fmt.Sprint("t", rnd(5))
					if rnd(4) == 0 {
						id = ""
					}
					ctx := WithPriority(t.Context(), p)
					if id != "" {
						ctx = WithTenant(ctx, id)
					}
					var cancel context.CancelFunc
					switch rnd(4) {
					case 0:
						ctx, cancel = context.WithTimeout(ctx, time.Duration(rnd(200))*time.Millisecond)
					case 1:
						ctx, cancel = context.WithCancel(ctx)
						d := time.Duration(rnd(100)) * time.Millisecond
						time.AfterFunc(d, cancel)
					default:
						cancel = func() {}
					}
					wg.Go(func() {
						defer cancel()
						get(ctx, tr, "")
					})
					if i%20 == 0 {
						pinLimit(l, 1+rnd(12))
					}
					if rnd(3) == 0 {
						time.Sleep(time.Duration(rnd(5)) * time.Millisecond)
					}
				}
				wg.Wait()
				time.Sleep(time.Second)
				l.lock()
				defer l.unlock()
				if l.q.len() != 0 || l.slot.inUse != 0 {
					t.Errorf("after all: queue %d, in use %d", l.q.len(), l.slot.inUse)
				}
				for p := range l.q.levels {
					lv := &l.q.levels[p]
					lv.each(func(tn *tenant) {
						t.Errorf("level %d tenant %q left: in flight %d, waiters %d", p, tn.id, tn.inFlight, len(tn.waiters))
					})
					if lv.n != 0 || lv.queuing != 0 {
						t.Errorf("level %d: n %d queuing %d", p, lv.n, lv.queuing)
					}
				}
			})
		})
	}
}
