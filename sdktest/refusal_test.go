package sdktest

import (
	"context"
	"errors"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-go/sluice"
)

// countingRT counts the requests that reach sluice.
type countingRT struct {
	rt http.RoundTripper
	n  atomic.Int32
}

func (c *countingRT) RoundTrip(req *http.Request) (*http.Response, error) {
	c.n.Add(1)
	return c.rt.RoundTrip(req)
}

// TestRefusalThroughSDKs: a call that sluice refuses at once (the host
// cools down for 30 s, past the call's 10 s deadline) comes back from
// openai-go and anthropic-sdk-go as an error that errors.As finds a
// *sluice.RejectedError in, with no attempt reaching the server. Both SDKs
// take the refusal for a connection error and try twice more after their
// backoff (about 0.5 s, then 1 s): three refusals in all.
func TestRefusalThroughSDKs(t *testing.T) {
	for _, c := range []struct {
		name string
		call func(ctx context.Context, c *http.Client, url string) error
	}{
		{"openai-go", openaiCall},
		{"anthropic-sdk-go", anthropicCall},
	} {
		t.Run(c.name, func(t *testing.T) {
			a := newAPI(t, apiError, http.StatusTooManyRequests, "Retry-After", "30", "X-Should-Retry", "false")
			tr, err := sluice.New(nil)
			if err != nil {
				t.Fatal(err)
			}
			defer tr.Close()
			rt := &countingRT{rt: tr}
			hc := &http.Client{Transport: rt}
			c.call(context.Background(), hc, a.URL) // the host cools down for 30 s
			rt.n.Store(0)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			start := time.Now()
			err = c.call(ctx, hc, a.URL)
			var rej *sluice.RejectedError
			t.Logf("%d refusals in %v: %v", rt.n.Load(), time.Since(start).Round(time.Millisecond), err)
			if !errors.As(err, &rej) {
				t.Fatalf("error %v, want one that holds a *sluice.RejectedError", err)
			}
			if got := a.n.Load(); got != 1 {
				t.Errorf("the server saw %d attempts, want only the one that began the cooldown", got)
			}
			if got := rt.n.Load(); got != 3 {
				t.Errorf("%d requests reached sluice, want 3: the SDK's first try and its two retries", got)
			}
		})
	}
}
