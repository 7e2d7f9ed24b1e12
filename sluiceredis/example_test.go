package sluiceredis_test

import (
	"context"
	"log"
	"log/slog"
	"net/http"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/sluiceredis"
)

// Every process of a fleet builds its Transport this way; those that use
// the same Redis and call the same host share its 500 requests a minute,
// and at most 20 of their requests are in flight at once.
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
