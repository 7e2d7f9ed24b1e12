package sluice_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-go/sluice"
)

// WithHeadroom keeps a share of the published allowance unused, for
// another client of the same account; Stats shows the pace it makes.
func ExampleWithHeadroom() {
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer api.Close()
	tr, err := sluice.New(nil,
		sluice.WithRate(100, time.Second), // the published allowance
		sluice.WithBurst(5),               // at most 5 at once after an idle spell
		sluice.WithHeadroom(0.8))          // use 80 of the 100
	if err != nil {
		log.Fatal(err)
	}
	resp, err := (&http.Client{Transport: tr}).Get(api.URL)
	if err != nil {
		log.Fatal(err)
	}
	resp.Body.Close()

	lane, _ := tr.LaneStats(strings.TrimPrefix(api.URL, "http://"))
	fmt.Printf("pace %.0f/s, ceiling %.0f/s\n", lane.Rate, lane.Ceiling)
	// Output: pace 80/s, ceiling 80/s
}

// WithConcurrency bounds the in-flight limit that sluice otherwise sizes
// from the rate and the latency; equal bounds fix it.
func ExampleWithConcurrency() {
	var inFlight, most atomic.Int32
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := inFlight.Add(1)
		defer inFlight.Add(-1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		time.Sleep(20 * time.Millisecond)
	}))
	defer api.Close()
	tr, err := sluice.New(nil, sluice.WithRate(1000, time.Second), sluice.WithConcurrency(2, 2))
	if err != nil {
		log.Fatal(err)
	}
	client := &http.Client{Transport: tr}

	var wg sync.WaitGroup
	for range 6 {
		wg.Go(func() {
			resp, err := client.Get(api.URL)
			if err != nil {
				log.Print(err)
				return
			}
			resp.Body.Close()
		})
	}
	wg.Wait()
	fmt.Println("most in flight at once:", most.Load())
	// Output: most in flight at once: 2
}

// WithMaxWait refuses at once a request of a level whose estimated wait is
// longer than it may wait, rather than let it wait and fail; so does a
// context deadline that the wait would pass.
func ExampleWithMaxWait() {
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer api.Close()
	tr, err := sluice.New(nil,
		sluice.WithRate(1, time.Second),
		sluice.WithMaxWait(sluice.Interactive, 100*time.Millisecond))
	if err != nil {
		log.Fatal(err)
	}
	client := &http.Client{Transport: tr}
	get := func(p sluice.Priority) error {
		req, _ := http.NewRequestWithContext(sluice.WithPriority(context.Background(), p), http.MethodGet, api.URL, nil)
		resp, err := client.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		return err
	}

	fmt.Println("first:", get(sluice.Interactive)) // takes the second's token
	err = get(sluice.Interactive)                  // would wait about a second
	var rej *sluice.RejectedError
	if errors.As(err, &rej) {
		fmt.Println("second:", errors.Is(err, sluice.ErrRejected), rej.Reason, "retry after", rej.RetryAfter.Round(time.Second))
	}
	// Output:
	// first: <nil>
	// second: true max-wait retry after 1s
}

// WithRetry sets how many times a request is tried again; WithBackoff how
// long to wait when the server names no time, WithMaxRetryAfter the
// longest a server may make the lane wait, WithRetryBudget how many
// retries a lane may make against its first attempts.
func ExampleWithRetry() {
	var calls atomic.Int32
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) == 1 {
			http.Error(w, "try again", http.StatusServiceUnavailable)
			return
		}
		io.WriteString(w, "ok")
	}))
	defer api.Close()
	tr, err := sluice.New(nil,
		sluice.WithRate(100, time.Second),
		sluice.WithRetry(3),
		sluice.WithBackoff(func(min, max time.Duration, attempt int, resp *http.Response) time.Duration {
			return 10 * time.Millisecond << attempt
		}),
		sluice.WithMaxRetryAfter(time.Minute),
		sluice.WithRetryBudget(0.1, 5))
	if err != nil {
		log.Fatal(err)
	}
	resp, err := (&http.Client{Transport: tr}).Get(api.URL)
	if err != nil {
		log.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()

	lane, _ := tr.LaneStats(strings.TrimPrefix(api.URL, "http://"))
	fmt.Printf("%d %s after %d attempts (%d retry)\n", resp.StatusCode, body, calls.Load(), lane.Retries)
	// Output: 200 ok after 2 attempts (1 retry)
}

// WithKey chooses the budget a request draws on: here one per customer of
// a multi-tenant API, each with the rate the API gives each customer.
// WithLaneIdle forgets a customer's lane once it has been idle that long.
func ExampleWithKey() {
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer api.Close()
	tr, err := sluice.New(nil,
		sluice.WithRate(10, time.Second),
		sluice.WithKey(func(r *http.Request) string { return r.Header.Get("X-Customer") }),
		sluice.WithLaneIdle(time.Minute))
	if err != nil {
		log.Fatal(err)
	}
	client := &http.Client{Transport: tr}
	for _, customer := range []string{"acme", "globex", "acme"} {
		req, _ := http.NewRequest(http.MethodGet, api.URL, nil)
		req.Header.Set("X-Customer", customer)
		resp, err := client.Do(req)
		if err != nil {
			log.Fatal(err)
		}
		resp.Body.Close()
	}

	for _, lane := range tr.Stats().Lanes {
		fmt.Println(lane.Key, lane.Levels[sluice.Normal].Granted)
	}
	// Output:
	// acme 2
	// globex 1
}

// Two models of one API, each limited on its own: naming the model as the
// call's sub-limit gives each its own pace, cooldown and budgets, under
// the lane of the host.
func ExampleWithSublimit() {
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer api.Close()
	tr, err := sluice.New(nil, sluice.WithBudget("tokens", 30000, time.Minute))
	if err != nil {
		log.Fatal(err)
	}
	client := &http.Client{Transport: tr}
	for _, model := range []string{"gpt-4o", "gpt-4o-mini", "gpt-4o-mini"} {
		ctx := sluice.WithCost(sluice.WithSublimit(context.Background(), model), "tokens", 500)
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, api.URL+"/v1/chat/completions", nil)
		resp, err := client.Do(req)
		if err != nil {
			log.Fatal(err)
		}
		resp.Body.Close()
	}

	for _, lane := range tr.Stats().Lanes {
		fmt.Printf("%q %d\n", lane.Sublimit, lane.Levels[sluice.Normal].Granted)
	}
	// Output:
	// "" 3
	// "gpt-4o" 1
	// "gpt-4o-mini" 2
}

// Each model of an LLM API has requests per minute of its own: each
// sub-limit paces to its model's, under the key's rate for all.
func ExampleWithSublimitRate() {
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer api.Close()
	tr, err := sluice.New(nil,
		sluice.WithRate(10000, time.Minute),
		sluice.WithSublimitRate("gpt-4o", 500, time.Minute),
		sluice.WithSublimitRate("gpt-4o-mini", 3000, time.Minute))
	if err != nil {
		log.Fatal(err)
	}
	client := &http.Client{Transport: tr}
	for _, model := range []string{"gpt-4o", "gpt-4o-mini"} {
		ctx := sluice.WithSublimit(context.Background(), model)
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, api.URL+"/v1/chat/completions", nil)
		resp, err := client.Do(req)
		if err != nil {
			log.Fatal(err)
		}
		resp.Body.Close()
	}

	for _, lane := range tr.Stats().Lanes {
		fmt.Printf("%q paced to %.0f a minute\n", lane.Sublimit, lane.Rate*60)
	}
	// Output:
	// "" paced to 10000 a minute
	// "gpt-4o" paced to 500 a minute
	// "gpt-4o-mini" paced to 3000 a minute
}

// ForEach runs a function for every item of a sequence, as many at once as
// the Transport can send, and stops at the first error.
func ExampleForEach() {
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, strings.ToUpper(r.URL.Query().Get("name")))
	}))
	defer api.Close()
	tr, err := sluice.New(nil, sluice.WithRate(100, time.Second))
	if err != nil {
		log.Fatal(err)
	}
	client := &http.Client{Transport: tr}

	names := []string{"ada", "grace", "edsger", "barbara"}
	var mu sync.Mutex
	var upper []string
	err = sluice.ForEach(context.Background(), tr, slices.Values(names), func(ctx context.Context, name string) error {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, api.URL+"?name="+name, nil)
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		mu.Lock()
		upper = append(upper, string(b))
		mu.Unlock()
		return err
	})
	slices.Sort(upper)
	fmt.Println(upper, err)
	// Output: [ADA BARBARA EDSGER GRACE] <nil>
}

// A response streamed as server-sent events gives its in-flight slot back
// when its first event arrives, so that a long stream does not hold back
// the lane's other calls; HoldStream keeps the slot until the body is
// closed, for servers that limit concurrent streams.
func ExampleHoldStream() {
	const event = "data: hello\n\n"
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, event)
		w.(http.Flusher).Flush()
		<-r.Context().Done() // the stream stays open until the client closes it
	}))
	defer api.Close()
	tr, err := sluice.New(nil, sluice.WithRate(100, time.Second))
	if err != nil {
		log.Fatal(err)
	}
	client := &http.Client{Transport: tr}
	key := strings.TrimPrefix(api.URL, "http://")

	for _, ctx := range []context.Context{context.Background(), sluice.HoldStream(context.Background())} {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, api.URL, nil)
		resp, err := client.Do(req)
		if err != nil {
			log.Fatal(err)
		}
		if _, err := io.ReadFull(resp.Body, make([]byte, len(event))); err != nil {
			log.Fatal(err)
		}
		lane, _ := tr.LaneStats(key)
		fmt.Println("in flight after the first event:", lane.InFlight)
		resp.Body.Close()
	}
	// Output:
	// in flight after the first event: 0
	// in flight after the first event: 1
}
