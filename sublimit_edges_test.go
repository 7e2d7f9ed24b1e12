package sluice

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// TestSublimitOverloadCutsTheHost: an overload (a 529 without
// Retry-After) is of the server's capacity, which the host's in-flight
// limit bounds: the answer to a request that draws on a caller's sub-limit
// (a model, as with Anthropic) cuts the host's limit, as it does without a
// sub-limit, and the server that holds 8 at a time refuses few calls. A
// sub-limit, which bounds no slots, read it as a pause and left 84% of
// them refused.
func TestSublimitOverloadCutsTheHost(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &overloadBase{capacity: 8, latency: 50 * time.Millisecond}
		tr := mustNew(t, base, WithRate(1000, time.Second), WithRetry(0))
		defer tr.Close()
		start := time.Now()
		closedLoop(WithSublimit(t.Context(), "model-a"), tr, 64, 20*time.Second)
		served, failed := base.count(start.Add(10 * time.Second))
		s, _ := tr.LaneStats("api.test")
		share := float64(failed) / float64(served+failed)
		t.Logf("second half: %d served (%.0f/s), %d refused (%.1f%%); host limit %d", served, float64(served)/10,
			failed, 100*share, s.Limit)
		if share > 0.2 {
			t.Errorf("%.0f%% of the calls in the second half got 529, want at most 20%% (as without a sub-limit)", 100*share)
		}
	})
}

// TestSublimitStreamOverloadIsTheHosts: a stream whose first event says
// the server is overloaded is an overload of the host, whose in-flight
// limit is the server's capacity, with a sub-limit named or not.
func TestSublimitStreamOverloadIsTheHosts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		var lanes []string
		obs := ObserverFunc(func(_ context.Context, e Event) {
			if e.Kind == EventOverloaded {
				mu.Lock()
				lanes = append(lanes, e.Lane+"/"+e.Sublimit)
				mu.Unlock()
			}
		})
		tr := mustNew(t, sseAnswer(sseOverloaded), WithObserver(obs))
		defer tr.Close()
		if err := call(WithSublimit(t.Context(), "model-a"), tr, "http://api.test/v1/messages"); err != nil {
			t.Fatal(err)
		}
		tr.WaitEvents(t.Context())
		mu.Lock()
		defer mu.Unlock()
		if len(lanes) != 1 || lanes[0] != "api.test/" {
			t.Errorf("EventOverloaded on lanes %q, want one on the host's lane %q", lanes, "api.test/")
		}
	})
}

// TestUnnamedAnswerEndsTheFallback: GitHub answers its App endpoints
// (JWT-authenticated, such as minting an installation token) with no
// X-RateLimit-* field at all. Such an answer names no limit, and a route
// not filed under one then goes under none (a route goes under the
// fallback only while every answer of the host for the last ten minutes
// named a limit): the App call does not wait for core's reset.
func TestUnnamedAnswerEndsTheFallback(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		time.Sleep(time.Until(time.Unix(1_700_000_000, 0))) // resets as Unix seconds
		reset := time.Now().Add(time.Hour)
		var left atomic.Int32
		left.Store(2)
		base := rtFunc(func(r *http.Request) (*http.Response, error) {
			h := http.Header{}
			if !strings.HasPrefix(r.URL.Path, "/app/") {
				h = githubQuota("core", max(left.Add(-1), 0), reset)
			}
			return &http.Response{StatusCode: 200, Header: h, Body: http.NoBody, Request: r}, nil
		})
		tr := mustNew(t, base, WithRetry(0))
		defer tr.Close()
		mustCall(t, tr, "http://api.test/repos/o/r")                         // core: 1 left
		mustCall(t, tr, "http://api.test/app/installations/7/access_tokens") // no rate-limit field
		mustCall(t, tr, "http://api.test/repos/o/r")                         // core: none left for an hour
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		start := time.Now()
		if err := call(ctx, tr, "http://api.test/app/installations/7/access_tokens"); err != nil {
			t.Errorf("an App call, whose answers name no limit, held by core's reset an hour away: %v after %v", err, time.Since(start))
		}
	})
}

// TestRouteUnderTheFallbackIsFiled: a route first sent under the fallback
// limit (the one most routes are filed under) whose answer names that
// same limit is filed under it, and its later calls wait on it whatever
// the fallback becomes. Here /repos/o/a's answers name core; once more
// routes are filed under search than under core and search is spent,
// /repos/o/a does not wait for search's reset.
func TestRouteUnderTheFallbackIsFiled(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		time.Sleep(time.Until(time.Unix(1_700_000_000, 0))) // resets as Unix seconds
		reset := time.Now().Add(time.Minute)
		var searchLeft atomic.Int32
		searchLeft.Store(2)
		base := rtFunc(func(r *http.Request) (*http.Response, error) {
			res, left := "core", int32(4000)
			if strings.HasPrefix(r.URL.Path, "/search/") {
				res, left = "search", max(searchLeft.Add(-1), 0)
			}
			return &http.Response{StatusCode: 200, Header: githubQuota(res, left, reset), Body: http.NoBody, Request: r}, nil
		})
		tr := mustNew(t, base, WithRetry(0))
		defer tr.Close()
		mustCall(t, tr, "http://api.test/user")           // filed under core
		mustCall(t, tr, "http://api.test/repos/o/a")      // sent under the fallback, core; names core
		mustCall(t, tr, "http://api.test/search/issues")  // search: 1 left
		mustCall(t, tr, "http://api.test/search/commits") // search: none left for a minute
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		if err := call(ctx, tr, "http://api.test/repos/o/a"); err != nil {
			t.Errorf("a core route, whose answer named core, held by search's reset: %v", err)
		}
	})
}

// TestRouteRememberedAfterRefile: a route filed anew (an answer named
// another limit) between a request's lookup and its remembering the lane
// it found keeps no lane of the old limit: its calls would otherwise draw
// on the old limit until another answer came.
func TestRouteRememberedAfterRefile(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	rs := newRoutes()
	const r = "GET /search/issues"
	rs.file(r, filed{name: "core", at: now})
	name, sub := rs.lookup(r, "/search/issues", now) // a request finds core, no lane yet
	if name != "core" || sub != nil {
		t.Fatalf("lookup: %q, %v", name, sub)
	}
	rs.file(r, filed{name: "search", at: now}) // meanwhile an answer names search
	core := &lane{key: "api.test" + subSep + "core"}
	rs.remember(r, core) // the request remembers core's lane
	if name, sub := rs.lookup(r, "/search/issues", now); sub == core {
		t.Errorf("route filed under %q is drawn on core's lane", name)
	}
}

// mustCall makes a call to each of urls through tr in turn, and ends the
// test at the first error.
func mustCall(t *testing.T, tr *Transport, urls ...string) {
	t.Helper()
	for _, u := range urls {
		if err := call(t.Context(), tr, u); err != nil {
			t.Fatalf("%s: %v", u, err)
		}
	}
}

// githubQuota is what GitHub says of the quota of resource, of 5,000: left
// remaining until reset.
func githubQuota(resource string, left int32, reset time.Time) http.Header {
	return http.Header{"X-Ratelimit-Resource": {resource}, "X-Ratelimit-Limit": {"5000"},
		"X-Ratelimit-Remaining": {strconv.Itoa(int(left))}, "X-Ratelimit-Reset": {strconv.FormatInt(reset.Unix(), 10)}}
}
