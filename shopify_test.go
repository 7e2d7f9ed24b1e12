package sluice

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// shopifyBase models Shopify's GraphQL Admin API: a leaky bucket of size
// points restoring restore a second. A query (its requested cost in the
// X-Query-Cost header, as the test states it) is throttled if the bucket
// holds less than its requested cost; else the requested cost is taken
// when it arrives and what it did not use is given back when it is
// answered, latency later. Every answer states extensions.cost, the
// bucket's state after the query; a throttled one, THROTTLED in its
// errors. Its actual cost is a share of the requested one, from 0.3 to 1,
// in turn.
type shopifyBase struct {
	size, restore float64
	latency       time.Duration

	mu        sync.Mutex
	level     float64
	at        time.Time
	n         int
	throttled int
	arrivals  []time.Time
	spent     []spend // actual costs, by when the query was answered
}

type spend struct {
	at   time.Time
	cost float64
}

// fill brings the bucket to now; b.mu is held.
func (b *shopifyBase) fill(now time.Time) {
	if !b.at.IsZero() {
		b.level = min(b.size, b.level+now.Sub(b.at).Seconds()*b.restore)
	}
	b.at = now
}

func (b *shopifyBase) RoundTrip(req *http.Request) (*http.Response, error) {
	requested, _ := strconv.ParseFloat(req.Header.Get("X-Query-Cost"), 64)
	b.mu.Lock()
	b.fill(time.Now())
	b.arrivals = append(b.arrivals, time.Now())
	if requested > b.level {
		b.throttled++
		body := fmt.Sprintf(`{"errors":[{"message":"Throttled","extensions":{"code":"THROTTLED","documentation":"https://shopify.dev/api/usage/rate-limits"}}],"extensions":{"cost":{"requestedQueryCost":%g,"actualQueryCost":null,"throttleStatus":{"maximumAvailable":%g,"currentlyAvailable":%d,"restoreRate":%g}}}}`,
			requested, b.size, int(b.level), b.restore)
		b.mu.Unlock()
		return b.answer(req, body), nil
	}
	b.level -= requested
	actual := requested * (0.3 + 0.1*float64(b.n%8))
	b.n++
	b.mu.Unlock()
	time.Sleep(b.latency)
	b.mu.Lock()
	now := time.Now()
	b.fill(now)
	b.level = min(b.size, b.level+requested-actual)
	b.spent = append(b.spent, spend{now, actual})
	body := fmt.Sprintf(`{"data":{"products":{"edges":[]}},"extensions":{"cost":{"requestedQueryCost":%g,"actualQueryCost":%g,"throttleStatus":{"maximumAvailable":%g,"currentlyAvailable":%d,"restoreRate":%g}}}}`,
		requested, actual, b.size, int(b.level), b.restore)
	b.mu.Unlock()
	return b.answer(req, body), nil
}

func (b *shopifyBase) answer(req *http.Request, body string) *http.Response {
	return &http.Response{StatusCode: 200, Request: req, Header: http.Header{"Content-Type": {"application/json; charset=utf-8"}},
		Body: io.NopCloser(strings.NewReader(body))}
}

// spentSince returns the actual points spent from from on.
func (b *shopifyBase) spentSince(from time.Time) float64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	var s float64
	for _, x := range b.spent {
		if !x.at.Before(from) {
			s += x.cost
		}
	}
	return s
}

// TestShopifyPoints: queries of 50 to 400 points, estimated at their
// requested cost, against Shopify's bucket of 1,000 points restoring 50 a
// second, by 8 callers for two minutes of virtual time. sluice reads each
// answer's extensions.cost on a graphql.json path: the actual cost
// replaces the estimate and currentlyAvailable the budget's level, so the
// lane spends what the bucket restores (at least 0.85 of it over the last
// 90 s: queries of up to 400 points make a shorter span move by several)
// with at most 2% throttled. The same lane on a path whose body it
// does not read pays the requested cost of every query, and spends only
// what the queries' actual share of it allows.
func TestShopifyPoints(t *testing.T) {
	run := func(t *testing.T, path string) (spent float64, throttled, queries int) {
		base := &shopifyBase{size: 1000, restore: 50, latency: 150 * time.Millisecond, level: 1000}
		tr := mustNew(t, base, WithRate(20, time.Second), WithBudget("points", 1000, 20*time.Second), WithRetry(0))
		costs := []int{50, 100, 200, 400, 100, 50}
		ctx, cancel := context.WithCancel(t.Context())
		time.AfterFunc(2*time.Minute, cancel)
		var wg sync.WaitGroup
		var mu sync.Mutex
		for w := range 8 {
			wg.Go(func() {
				for i := w; ctx.Err() == nil; i++ {
					c := costs[i%len(costs)]
					req, _ := http.NewRequestWithContext(WithCost(ctx, "points", c), "POST", "https://shop.test"+path, nil)
					req.Header.Set("X-Query-Cost", strconv.Itoa(c))
					resp, err := tr.RoundTrip(req)
					if err != nil {
						continue
					}
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					mu.Lock()
					queries++
					mu.Unlock()
				}
			})
		}
		start := time.Now()
		wg.Wait()
		base.mu.Lock()
		throttled = base.throttled
		base.mu.Unlock()
		return base.spentSince(start.Add(30*time.Second)) / 90, throttled, queries
	}
	var read, blind float64
	synctest.Test(t, func(t *testing.T) {
		spent, throttled, queries := run(t, "/admin/api/2025-01/graphql.json")
		read = spent
		t.Logf("reading extensions.cost: %.1f points/s over the last 90 s (the bucket restores 50); %d of %d queries throttled", spent, throttled, queries)
		if spent < 0.85*50 {
			t.Errorf("spent %.1f points/s, want at least 0.85 of the 50 restored", spent)
		}
		if float64(throttled) > 0.02*float64(queries) {
			t.Errorf("%d of %d queries throttled, want at most 2%%", throttled, queries)
		}
	})
	synctest.Test(t, func(t *testing.T) {
		spent, throttled, queries := run(t, "/admin/api/2025-01/products")
		blind = spent
		t.Logf("estimates alone: %.1f points/s; %d of %d queries throttled", spent, throttled, queries)
	})
	if read < 1.1*blind {
		t.Errorf("reading the cost spent %.1f points/s, estimates alone %.1f: want at least a tenth more", read, blind)
	}
}

// TestShopifyThrottledLowersBudget: a bucket another client has drained to
// 100 points, which the lane's budget believes full. The first query of
// 400 points is THROTTLED; its answer's currentlyAvailable lowers the
// budget, so the lane sends the next only once the bucket can hold it
// (6 s at 50 a second), and is throttled no more; its request rate is not
// cut for it (the budget explains the refusal).
func TestShopifyThrottledLowersBudget(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &shopifyBase{size: 1000, restore: 50, latency: 100 * time.Millisecond, level: 100}
		tr := mustNew(t, base, WithRate(20, time.Second), WithBudget("points", 1000, 20*time.Second), WithRetry(0))
		start := time.Now()
		for range 4 {
			req, _ := http.NewRequestWithContext(WithCost(t.Context(), "points", 400), "POST", "https://shop.test/admin/api/2025-01/graphql.json", nil)
			req.Header.Set("X-Query-Cost", "400")
			resp, err := tr.RoundTrip(req)
			if err != nil {
				t.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		base.mu.Lock()
		throttled := base.throttled
		var sent []time.Duration
		for _, a := range base.arrivals {
			sent = append(sent, a.Sub(start))
		}
		base.mu.Unlock()
		ls, _ := tr.LaneStats("shop.test")
		t.Logf("sent at %v; %d throttled; rate %v", sent, throttled, ls.Rate)
		if throttled != 1 {
			t.Errorf("%d queries throttled, want the first only", throttled)
		}
		if sent[1] < 5*time.Second {
			t.Errorf("second query sent %v after the first was throttled, want once the bucket holds 400 points (6 s)", sent[1])
		}
		if ls.Rate < 20 {
			t.Errorf("request rate %v after a refusal for points, want 20 (not cut)", ls.Rate)
		}
	})
}
