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
// the same Redis and call the same host share its 500 requests a minute,
// and at most 20 of their requests are in flight at once. (This example is
// compiled, not run: it needs the Redis server it names. ExampleBackend
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
		// 20 in flight across the fleet. A dead process's places free up
		// within 30s; a live one renews its leases, so calls may be longer.
		sluiceredis.WithInFlight(20, 30*time.Second),
		// Eight processes: while Redis is down, each keeps to an eighth.
		sluiceredis.WithFallbackShare(1.0/8),
		sluiceredis.WithLogger(slog.Default()))
	if err != nil {
		log.Fatal(err)
	}
	tr, err := sluice.New(nil, sluice.WithRate(500, time.Minute), sluice.WithBackend(b))
	if err != nil {
		log.Fatal(err)
	}
	client := &http.Client{Transport: tr}
	_ = client // use it as any http.Client
}

// A large fleet, or one whose Redis is in another zone, leases shares
// instead: each process asks Redis once a second for its share of each
// key's rate, by what its lanes want at each priority level, and paces its
// requests inside it with no Redis call per request. A process whose
// requests are Interactive is served before any process's Batch ones.
// (This example is compiled, not run: it needs the Redis server it names.)
func ExampleWithShares() {
	rdb := redis.NewClient(&redis.Options{Addr: "redis.other-zone:6379", ContextTimeoutEnabled: true})
	defer rdb.Close()

	b, err := sluiceredis.New(rdb, sluiceredis.WithShares(sluiceredis.DefaultRefresh))
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

// Two Transports on one Redis, as two processes of a fleet would be, share
// one budget per host: here two requests a second. The first process's
// request takes the budget's token; the second process's, sent right
// after, waits for the next, half a second later, as one process's
// second request would. (miniredis, an in-process fake, plays Redis here.)
func ExampleBackend() {
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
		b, err := sluiceredis.New(rdb)
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
