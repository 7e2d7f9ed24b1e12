package sluice_test

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"time"

	"github.com/sluice-go/sluice"
)

func ExampleWithObserver() {
	// An API that refuses the second call with a 429 and Retry-After.
	var calls atomic.Int32
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) == 2 {
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusTooManyRequests)
			return
		}
		fmt.Fprint(w, "ok")
	}))
	defer api.Close()

	// An Observer runs on a goroutine of its own, in event order: it may
	// log, count or export without slowing requests.
	obs := sluice.ObserverFunc(func(ctx context.Context, e sluice.Event) {
		switch e.Kind {
		case sluice.EventThrottled:
			fmt.Println("throttled:", e.Status)
		case sluice.EventCooldown:
			fmt.Printf("cooldown: %v for %s\n", e.Wait.Round(time.Second), e.Cause)
		case sluice.EventRetried:
			fmt.Printf("retry: attempt %d after a %d\n", e.Attempt, e.Status)
		}
	})
	tr, err := sluice.New(nil, sluice.WithRate(100, time.Second), sluice.WithObserver(obs))
	if err != nil {
		log.Fatal(err)
	}
	client := &http.Client{Transport: tr}
	for range 2 {
		resp, err := client.Get(api.URL)
		if err != nil {
			log.Fatal(err)
		}
		resp.Body.Close()
	}
	tr.WaitEvents(context.Background()) // before reading what the Observer saw
	// Output:
	// throttled: 429
	// cooldown: 1s for retry-after
	// retry: attempt 2 after a 429
}
