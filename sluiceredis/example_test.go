package sluiceredis_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/sluiceredis"
)

// Every process of a fleet builds its Transport this way; those that use
// the same Redis and call the same host share its 500 requests a second,
// and at most 20 of their requests are in flight at once. Each process
// asks Redis once a second for its share of each key's rate, by what its
// lanes want at each priority level, and paces its requests inside it
// with no Redis call per request: a process whose requests are
// Interactive is served before any process's Batch ones. (This example
// is compiled, not run: it needs the Redis server it names. ExampleTokens
// runs.)
func Example() {
	rdb := redis.NewClient(&redis.Options{
		Addr: "redis.internal:6379",
		// Required: without it go-redis ignores the deadline of each
		// call, and a stalled Redis would hold requests for seconds.
		ContextTimeoutEnabled: true,
	})
	defer rdb.Close()

	b, err := sluiceredis.New(rdb,
		// 20 in flight across the fleet, shared out as the rate is.
		sluiceredis.WithInFlight(20, 30*time.Second),
		// Eight processes: a process that never had a share keeps to an
		// eighth while Redis is down.
		sluiceredis.WithFallbackShare(1.0/8),
		sluiceredis.WithLogger(slog.Default()))
	if err != nil {
		log.Fatal(err)
	}
	// Close gives this process's shares back to the fleet at once, rather
	// than when their leases end; close it after the Transports.
	defer b.Close()
	tr, err := sluice.New(nil, sluice.WithRate(500, time.Second), sluice.WithBackend(b))
	if err != nil {
		log.Fatal(err)
	}
	defer tr.Close()
	req, _ := http.NewRequestWithContext(sluice.WithPriority(context.Background(), sluice.Interactive),
		"GET", "https://api.example.com/v1/things", nil)
	_ = req // send it with &http.Client{Transport: tr}
}

// A server that allows 10 requests a minute and refuses the first one
// over: a fleet of Tokens sends at most 10 in any minute, plus the burst,
// at one Redis call per request. (This example is compiled, not run: it
// needs the Redis server it names.)
func ExampleNewTokens() {
	rdb := redis.NewClient(&redis.Options{Addr: "redis.internal:6379", ContextTimeoutEnabled: true})
	defer rdb.Close()

	b, err := sluiceredis.NewTokens(rdb)
	if err != nil {
		log.Fatal(err)
	}
	defer b.Close()
	tr, err := sluice.New(nil, sluice.WithRate(10, time.Minute), sluice.WithBackend(b))
	if err != nil {
		log.Fatal(err)
	}
	defer tr.Close()
	client := &http.Client{Transport: tr}
	_ = client // use it as any http.Client
}

// Two Transports on one Redis, as two processes of a fleet would be, share
// one budget per host through Tokens: here two requests a second. The
// first process's request takes the budget's token; the second process's,
// sent right after, waits for the next, half a second later, as one
// process's second request would. (miniredis, an in-process fake, plays
// Redis here.)
func ExampleTokens() {
	mr := miniredis.NewMiniRedis()
	if err := mr.Start(); err != nil {
		log.Fatal(err)
	}
	defer mr.Close()
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "ok")
	}))
	defer api.Close()

	var processes []*http.Client
	for range 2 {
		rdb := redis.NewClient(&redis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true})
		defer rdb.Close()
		b, err := sluiceredis.NewTokens(rdb)
		if err != nil {
			log.Fatal(err)
		}
		defer b.Close()
		tr, err := sluice.New(api.Client().Transport, sluice.WithRate(2, time.Second), sluice.WithBackend(b))
		if err != nil {
			log.Fatal(err)
		}
		defer tr.Close()
		processes = append(processes, &http.Client{Transport: tr})
	}

	start := time.Now()
	for i, c := range processes {
		resp, err := c.Get(api.URL)
		if err != nil {
			log.Fatal(err)
		}
		resp.Body.Close()
		fmt.Printf("process %d: %s\n", i, resp.Status)
	}
	fmt.Println("the second waited for the fleet's next token:", time.Since(start) >= 400*time.Millisecond)
	// Output:
	// process 0: 200 OK
	// process 1: 200 OK
	// the second waited for the fleet's next token: true
}
