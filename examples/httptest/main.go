// Command httptest is a small API client that uses sluice, written to show
// how to test such code: see main_test.go beside it, whose examples run
// with go test.
//
// The client fetches orders from an API that publishes a rate limit. The
// program fetches -n orders, all at once through sluice.ForEach, from -url
// (by default from a fake API it starts itself), and prints how many are in
// each state:
//
//	go run ./examples/httptest -n 50
//
// The tests show three ways to test code like this:
//
//   - Against an httptest.Server that plays the API, with sluice's rate set
//     high so that the test runs fast: the code under test is unchanged,
//     only the Transport it is given differs (Example).
//   - Against an httptest.Server that answers 429 with a Retry-After, to
//     test what the code sees when the API pushes back: sluice waits, retries,
//     and the caller gets the 200 (Example_retryAfter).
//   - With the real rate and no network, in a testing/synctest bubble,
//     where time is virtual: pacing at 60 requests a minute is checked
//     exactly and instantly (TestPacingInVirtualTime).
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"iter"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"os/signal"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/sluice-go/sluice"
)

// Order is what the API returns for GET /orders/{id}.
type Order struct {
	ID     int    `json:"id"`
	Status string `json:"status"`
}

// Client calls the orders API. Its HTTP client is given to it, so that
// tests and programs choose the Transport: sluice in both, paced to the
// real limit in production and to whatever the test needs in tests.
type Client struct {
	BaseURL string
	HTTP    *http.Client
}

// Order fetches one order. Calls made with a context from
// sluice.WithPriority wait at that priority.
func (c *Client) Order(ctx context.Context, id int) (Order, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("%s/orders/%d", c.BaseURL, id), nil)
	if err != nil {
		return Order{}, err
	}
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return Order{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		io.Copy(io.Discard, io.LimitReader(resp.Body, 4<<10))
		return Order{}, fmt.Errorf("order %d: %s", id, resp.Status)
	}
	var o Order
	if err := json.NewDecoder(resp.Body).Decode(&o); err != nil {
		return Order{}, fmt.Errorf("order %d: %w", id, err)
	}
	return o, nil
}

// Orders fetches the orders ids yields, as many at once as tr allows, and
// returns them by ID. The first error stops it.
func (c *Client) Orders(ctx context.Context, tr *sluice.Transport, ids iter.Seq[int]) (map[int]Order, error) {
	var mu sync.Mutex
	out := make(map[int]Order)
	err := sluice.ForEach(ctx, tr, ids, func(ctx context.Context, id int) error {
		o, err := c.Order(ctx, id)
		if err != nil {
			return err
		}
		mu.Lock()
		out[id] = o
		mu.Unlock()
		return nil
	})
	return out, err
}

// fakeAPI plays the orders API: order n is "shipped" if n is even,
// "pending" otherwise.
func fakeAPI() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /orders/{id}", func(w http.ResponseWriter, r *http.Request) {
		var id int
		if _, err := fmt.Sscan(r.PathValue("id"), &id); err != nil {
			http.NotFound(w, r)
			return
		}
		status := "pending"
		if id%2 == 0 {
			status = "shipped"
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(Order{ID: id, Status: status})
	})
	return mux
}

type config struct {
	URL    string // the API; empty: start the fake one
	Orders int    // how many orders to fetch, IDs 1..Orders
	Rate   int    // the API's published limit, requests per second
}

func main() {
	cfg := config{Orders: 50, Rate: 20}
	flag.StringVar(&cfg.URL, "url", "", "the orders API (default: a fake one, started in process)")
	flag.IntVar(&cfg.Orders, "n", cfg.Orders, "orders to fetch")
	flag.IntVar(&cfg.Rate, "rate", cfg.Rate, "the API's published limit, requests per second")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, cfg, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "httptest:", err)
		os.Exit(1)
	}
}

// run fetches cfg.Orders orders and prints how many are in each state.
func run(ctx context.Context, cfg config, stdout io.Writer) error {
	var base http.RoundTripper // nil: http.DefaultTransport
	if cfg.URL == "" {
		srv := httptest.NewServer(fakeAPI())
		defer srv.Close()
		cfg.URL, base = srv.URL, srv.Client().Transport
	}
	tr, err := sluice.New(base, sluice.WithRate(cfg.Rate, time.Second))
	if err != nil {
		return err
	}
	c := &Client{BaseURL: strings.TrimSuffix(cfg.URL, "/"), HTTP: &http.Client{Transport: tr}}
	start := time.Now()
	orders, err := c.Orders(ctx, tr, func(yield func(int) bool) {
		for id := 1; id <= cfg.Orders; id++ {
			if !yield(id) {
				return
			}
		}
	})
	if err != nil {
		return err
	}
	byStatus := map[string]int{}
	for _, o := range orders {
		byStatus[o.Status]++
	}
	fmt.Fprintf(stdout, "%d orders in %v at %d requests/s:\n", len(orders), time.Since(start).Round(10*time.Millisecond), cfg.Rate)
	for _, s := range slices.Sorted(maps.Keys(byStatus)) {
		fmt.Fprintf(stdout, "  %-8s %d\n", s, byStatus[s])
	}
	return nil
}
