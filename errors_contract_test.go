package sluice

import (
	"context"
	"errors"
	"net"
	"net/http"
	"os"
	"testing"
	"testing/synctest"
	"time"
)

// TestDeadlineRefusalIsTimeout: a refusal for the context's deadline is a
// timeout to os.IsTimeout and a net.Error, directly and through
// http.Client, and still matches ErrRejected and
// context.DeadlineExceeded; other refusals are not timeouts.
func TestDeadlineRefusalIsTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := mustNew(t, &fakeBase{}, WithRate(1, time.Second), WithMaxWait(Batch, 10*time.Millisecond))
		if err := get(t.Context(), tr, ""); err != nil { // takes the only token
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
		defer cancel()
		err := get(ctx, tr, "")
		if !errors.Is(err, ErrRejected) || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("err = %v, want a deadline refusal", err)
		}
		if !os.IsTimeout(err) {
			t.Error("os.IsTimeout(refusal for the deadline) = false")
		}
		// A net.Error (Timeout and Temporary) for a caller of RoundTrip,
		// as the *url.Error of http.Client is.
		if ne := net.Error(nil); !errors.As(err, &ne) || !ne.Timeout() {
			t.Error("errors.As(refusal for the deadline, *net.Error) = false")
		}
		req, _ := http.NewRequestWithContext(ctx, "GET", "http://api.test/", nil)
		_, err = (&http.Client{Transport: tr}).Do(req)
		if !os.IsTimeout(err) || !errors.Is(err, ErrRejected) {
			t.Errorf("through http.Client: os.IsTimeout = %v, ErrRejected = %v (%v)", os.IsTimeout(err), errors.Is(err, ErrRejected), err)
		}
		err = get(WithPriority(t.Context(), Batch), tr, "")
		var rej *RejectedError
		if !errors.As(err, &rej) || rej.Reason != ReasonMaxWait {
			t.Fatalf("err = %v, want a max-wait refusal", err)
		}
		if os.IsTimeout(err) {
			t.Error("a max-wait refusal is not a timeout")
		}
	})
}
