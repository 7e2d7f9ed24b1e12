package main

import (
	"bytes"
	"context"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/goleak"

	"github.com/sluice-go/sluice"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// The code under test gets sluice over an httptest server's transport. In
// production the rate is the API's published limit; in a test it is set
// high, so that sluice paces nothing a test would notice and the test
// exercises the same code path.
func Example() {
	api := httptest.NewServer(fakeAPI())
	defer api.Close()

	tr, err := sluice.New(api.Client().Transport, sluice.WithRate(1000, time.Second))
	if err != nil {
		log.Fatal(err)
	}
	c := &Client{BaseURL: api.URL, HTTP: &http.Client{Transport: tr}}

	o, err := c.Order(context.Background(), 42)
	fmt.Println(o.ID, o.Status, err)

	orders, err := c.Orders(context.Background(), tr, slices.Values([]int{1, 2, 3}))
	fmt.Println(len(orders), orders[2].Status, orders[3].Status, err)
	// Output:
	// 42 shipped <nil>
	// 3 shipped pending <nil>
}

// A test server that pushes back shows what the code under test sees: with
// sluice's retries on (the default) the 429 never reaches it; sluice waits
// as long as the server said (here 50 ms, in the Retry-After-Ms form some
// APIs send) and tries again. Turn retries off with WithRetry(0) to test
// the code's own handling of a 429.
func Example_retryAfter() {
	var calls atomic.Int32
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) == 1 {
			w.Header().Set("Retry-After-Ms", "50")
			http.Error(w, "slow down", http.StatusTooManyRequests)
			return
		}
		fakeAPI().ServeHTTP(w, r)
	}))
	defer api.Close()
	host := strings.TrimPrefix(api.URL, "http://") // the lane's key: the URL's host

	tr, err := sluice.New(api.Client().Transport, sluice.WithRate(1000, time.Second))
	if err != nil {
		log.Fatal(err)
	}
	c := &Client{BaseURL: api.URL, HTTP: &http.Client{Transport: tr}}
	o, err := c.Order(context.Background(), 7)
	fmt.Println(o.Status, err)
	s, _ := tr.Stats().Lane(host)
	fmt.Printf("requests the API saw: %d; 429s: %d, retries: %d\n", calls.Load(), s.Throttled, s.Retries)

	calls.Store(0)
	noRetry, err := sluice.New(api.Client().Transport, sluice.WithRate(1000, time.Second), sluice.WithRetry(0))
	if err != nil {
		log.Fatal(err)
	}
	c.HTTP.Transport = noRetry
	_, err = c.Order(context.Background(), 7)
	fmt.Println(err)
	// Output:
	// pending <nil>
	// requests the API saw: 2; 429s: 1, retries: 1
	// order 7: 429 Too Many Requests
}

// roundTripFunc makes a function an http.RoundTripper.
type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(req *http.Request) (*http.Response, error) { return f(req) }

// TestPacingInVirtualTime checks the real pacing, 60 requests a minute, in
// no time at all: inside a synctest bubble the clock is virtual and moves
// only when every goroutine waits, so sluice's waits are exact and instant.
// Loopback sockets do not work in a bubble, so the API is served in memory:
// httptest.NewRecorder turns the handler into a RoundTripper.
func TestPacingInVirtualTime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		api := fakeAPI()
		start := time.Now()
		var mu sync.Mutex
		var sent []time.Duration
		base := roundTripFunc(func(req *http.Request) (*http.Response, error) {
			mu.Lock()
			sent = append(sent, time.Since(start))
			mu.Unlock()
			rec := httptest.NewRecorder()
			api.ServeHTTP(rec, req)
			return rec.Result(), nil
		})
		tr, err := sluice.New(base, sluice.WithRate(60, time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		c := &Client{BaseURL: "http://orders.test", HTTP: &http.Client{Transport: tr}}

		orders, err := c.Orders(t.Context(), tr, slices.Values([]int{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}))
		if err != nil || len(orders) != 10 {
			t.Fatalf("Orders: %d orders, %v", len(orders), err)
		}
		// One a second, the first at once: exactly, since time is virtual.
		for i, d := range sent {
			if d != time.Duration(i)*time.Second {
				t.Errorf("request %d sent at %v, want %ds", i, d, i)
			}
		}
		if d := time.Since(start); d != 9*time.Second {
			t.Errorf("10 orders took %v of virtual time, want 9s", d)
		}
	})
}

// TestRun runs the program against its fake API, as `go run` does.
func TestRun(t *testing.T) {
	var out bytes.Buffer
	if err := run(t.Context(), config{Orders: 20, Rate: 1000}, &out); err != nil {
		t.Fatal(err)
	}
	s := out.String()
	for _, want := range []string{"20 orders in ", "at 1000 requests/s", "pending  10", "shipped  10"} {
		if !strings.Contains(s, want) {
			t.Errorf("output lacks %q:\n%s", want, s)
		}
	}
}

// TestRunURL runs it against an API given by -url.
func TestRunURL(t *testing.T) {
	var paths sync.Map
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		paths.Store(r.URL.Path, true)
		fakeAPI().ServeHTTP(w, r)
	}))
	defer api.Close()
	u, _ := url.Parse(api.URL + "/")
	var out bytes.Buffer
	if err := run(t.Context(), config{URL: u.String(), Orders: 3, Rate: 1000}, &out); err != nil {
		t.Fatal(err)
	}
	for id := 1; id <= 3; id++ {
		if _, ok := paths.Load(fmt.Sprintf("/orders/%d", id)); !ok {
			t.Errorf("order %d not requested", id)
		}
	}
}
