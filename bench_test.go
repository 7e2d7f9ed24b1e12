package sluice

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sync/semaphore"
	"golang.org/x/time/rate"
)

// nopBase answers at once, as cheaply as a RoundTripper can: the cost
// measured on top of it is sluice's.
type nopBase struct{}

func (nopBase) RoundTrip(req *http.Request) (*http.Response, error) {
	return &http.Response{StatusCode: 200, Body: http.NoBody, Request: req}, nil
}

// bodyBase answers with a body, so sluice wraps it.
type bodyBase struct{}

func (bodyBase) RoundTrip(req *http.Request) (*http.Response, error) {
	return &http.Response{StatusCode: 200, Body: io.NopCloser(strings.NewReader("")), Request: req}, nil
}

// BenchmarkRoundTrip measures sluice's overhead on the fast path (token and
// slot free, nobody waiting) against the bare base, and against
// x/time/rate plus x/sync/semaphore composed by hand.
func BenchmarkRoundTripBases(b *testing.B) {
	req, _ := http.NewRequest("GET", "http://api.test/", nil)
	// A request that carries a tenant: what a multi-tenant service sends.
	treq := req.WithContext(WithTenant(context.Background(), "acme"))
	for _, base := range []http.RoundTripper{nopBase{}, bodyBase{}} {
		name := fmt.Sprintf("%T", base)[len("sluice."):]
		tr := mustNew(b, base, WithRate(1e9, time.Second), WithBurst(1<<30))
		// An Observer that does nothing: what the events cost when one
		// is set (without one, only a nil check).
		otr := mustNew(b, base, WithRate(1e9, time.Second), WithBurst(1<<30),
			WithObserver(ObserverFunc(func(context.Context, Event) {})))
		lim := rate.NewLimiter(1e9, 1<<30)
		sem := semaphore.NewWeighted(DefaultMaxConcurrency)
		ctx := context.Background()
		variants := []struct {
			name string
			rt   func() error
		}{
			{"bare", func() error { return send(base, req) }},
			{"sluice", func() error { return send(tr, req) }},
			{"sluice+tenant", func() error { return send(tr, treq) }},
			{"sluice+observer", func() error { return send(otr, req) }},
			{"rate+semaphore", func() error {
				if err := lim.Wait(ctx); err != nil {
					return err
				}
				if err := sem.Acquire(ctx, 1); err != nil {
					return err
				}
				defer sem.Release(1)
				return send(base, req)
			}},
		}
		for _, v := range variants {
			b.Run(name+"/"+v.name, func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					if err := v.rt(); err != nil {
						b.Fatal(err)
					}
				}
			})
			b.Run(name+"/"+v.name+"/parallel", func(b *testing.B) {
				b.ReportAllocs()
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						if err := v.rt(); err != nil {
							b.Error(err)
							return
						}
					}
				})
			})
		}
		otr.WaitEvents(context.Background())
	}
}

// headerBase answers as GitHub does: every response states the quota.
type headerBase struct{ h http.Header }

func (b headerBase) RoundTrip(req *http.Request) (*http.Response, error) {
	return &http.Response{StatusCode: 200, Header: b.h, Body: http.NoBody, Request: req}, nil
}

// BenchmarkRoundTripHeaders measures what reading a quota on every response
// costs: the headers are parsed and the lane's pace set from them.
func BenchmarkRoundTripHeaders(b *testing.B) {
	req, _ := http.NewRequest("GET", "http://api.test/", nil)
	h := http.Header{}
	h.Set("X-RateLimit-Limit", "5000")
	h.Set("X-RateLimit-Remaining", "4990")
	h.Set("X-RateLimit-Reset", strconv.FormatInt(time.Now().Add(time.Hour).Unix(), 10))
	base := headerBase{h}
	tr := mustNew(b, base, WithRate(1e9, time.Second), WithBurst(1<<30))
	for _, v := range []struct {
		name string
		rt   http.RoundTripper
	}{{"bare", base}, {"sluice", tr}} {
		b.Run(v.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if err := send(v.rt, req); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func send(rt http.RoundTripper, req *http.Request) error {
	resp, err := rt.RoundTrip(req)
	if err != nil {
		return err
	}
	return resp.Body.Close()
}

// BenchmarkWaitQueue measures the queue operations at a depth of n waiters:
// enqueue, grant (pop the best) and cancel (remove from the middle), with
// every waiter anonymous and with the waiters spread over 10,000 tenants
// that take turns.
func BenchmarkWaitQueue(b *testing.B) {
	for _, tenants := range []int{0, 10_000} {
		for _, n := range []int{1_000, 10_000, 100_000} {
			benchWaitQueue(b, n, tenants)
		}
	}
}

func benchWaitQueue(b *testing.B, n, tenants int) {
	const limit = 256
	id := func(i int) string {
		if tenants == 0 {
			return ""
		}
		return strconv.Itoa(i % tenants)
	}
	fill := func() (*waitQueue, []*waiter) {
		q := &waitQueue{aging: time.Second, lowShare: 5}
		q.init([numLevels]float64{})
		ws := make([]*waiter, n)
		for i := range ws {
			p := Priority(i % numLevels)
			ws[i] = &waiter{level: p, tn: q.levels[p].tenant(id(i)), enq: time.Duration(i) * time.Millisecond, ready: make(chan struct{})}
			q.push(ws[i], limit)
		}
		return q, ws
	}
	name := fmt.Sprintf("depth=%d/tenants=%d", n, tenants)
	b.Run("enqueue+grant/"+name, func(b *testing.B) {
		q, _ := fill()
		t0 := time.Hour
		i := 0
		b.ReportAllocs()
		for b.Loop() {
			i++
			p := Priority(i % numLevels)
			q.push(&waiter{level: p, tn: q.levels[p].tenant(id(i)), enq: t0 + time.Duration(i), ready: make(chan struct{})}, limit)
			q.pop(limit, nil)
		}
	})
	b.Run("cancel/"+name, func(b *testing.B) {
		q, ws := fill()
		i := 0
		for b.Loop() {
			w := ws[(i*7919)%n]
			i++
			q.remove(w)
			w.tn = q.levels[w.level].tenant(w.tn.id) // the record may have been dropped
			q.push(w, limit)                         // keep the depth
		}
	})
	b.Run("bytes-per-waiter/"+name, func(b *testing.B) {
		for b.Loop() {
			fill()
		}
		b.ReportMetric(0, "ns/op")
		b.ReportAllocs()
	})
}
