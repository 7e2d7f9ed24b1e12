package sluiceprom_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/sluiceprom"
)

// throttleOnce answers its first call with a 429 and Retry-After: 2, and
// every other with 200, at once.
type throttleOnce struct{ n atomic.Int32 }

func (b *throttleOnce) RoundTrip(req *http.Request) (*http.Response, error) {
	if b.n.Add(1) == 1 {
		return &http.Response{StatusCode: 429, Header: http.Header{"Retry-After": {"2"}}, Body: http.NoBody, Request: req}, nil
	}
	return &http.Response{StatusCode: 200, Header: http.Header{}, Body: io.NopCloser(strings.NewReader("ok")), Request: req}, nil
}

// On virtual time, the gauges read the cooldown and the queue as they are,
// and the histogram holds the retry's wait for the cooldown.
func TestVirtualTimeline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m, err := sluiceprom.New()
		if err != nil {
			t.Fatal(err)
		}
		tr, err := sluice.New(&throttleOnce{}, sluice.WithRate(10, time.Second), sluice.WithObserver(m))
		if err != nil {
			t.Fatal(err)
		}
		m.Watch(tr)
		defer tr.Close()
		reg := prometheus.NewPedanticRegistry()
		reg.MustRegister(m)

		done := make(chan struct{})
		for range 2 { // the second queues behind the first's cooldown
			go func() {
				defer func() { done <- struct{}{} }()
				req, _ := http.NewRequest("GET", "http://api.example.com/x", nil)
				resp, err := tr.RoundTrip(req)
				if err != nil {
					t.Error(err)
					return
				}
				resp.Body.Close()
			}()
			synctest.Wait()
		}
		time.Sleep(500 * time.Millisecond) // into the 2 s cooldown
		synctest.Wait()
		fams, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		const lane = "api.example.com"
		if c := value(t, fams, "sluice_cooldown_remaining_seconds", "lane", lane); c != 1.5 {
			t.Errorf("cooldown remaining %v s, 0.5 s into a 2 s cooldown", c)
		}
		if q := value(t, fams, "sluice_queued_requests", "lane", lane, "priority", "normal"); q != 2 {
			t.Errorf("queued %v, want the retry and the second request", q)
		}
		if o := value(t, fams, "sluice_queue_oldest_wait_seconds", "lane", lane, "priority", "normal"); o != 0.5 {
			t.Errorf("oldest wait %v s, want 0.5", o)
		}
		<-done
		<-done
		tr.WaitEvents(context.Background())
		if fams, err = reg.Gather(); err != nil {
			t.Fatal(err)
		}
		h, ok := metric(fams, "sluice_wait_seconds", "lane", lane, "priority", "normal")
		if !ok {
			t.Fatal("no wait histogram")
		}
		// No wait; then the retry and the second request after the
		// cooldown (one of them two tokens later, at the rate cut to 9/s:
		// the grant after a cooldown's first waits two tokens' time).
		if n, s := h.Histogram.GetSampleCount(), h.Histogram.GetSampleSum(); n != 3 || s < 4.2 || s > 4.25 {
			t.Errorf("wait histogram: %d samples summing %v s, want 3 summing 4 s and two tokens' time", n, s)
		}
		if c := value(t, fams, "sluice_cooldown_remaining_seconds", "lane", lane); c != 0 {
			t.Errorf("cooldown remaining %v s after it", c)
		}
	})
}

// overloaded answers every call with Anthropic's 529 overloaded_error.
type overloaded struct{}

func (overloaded) RoundTrip(req *http.Request) (*http.Response, error) {
	return &http.Response{StatusCode: 529, Header: http.Header{}, Request: req,
		Body: io.NopCloser(strings.NewReader(`{"type":"error","error":{"type":"overloaded_error"}}`))}, nil
}

// Each overload the server answers is counted in sluice_overloaded_total,
// under its lane's label.
func TestOverloadedCounter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m, err := sluiceprom.New()
		if err != nil {
			t.Fatal(err)
		}
		tr, err := sluice.New(overloaded{}, sluice.WithRate(100, time.Second), sluice.WithRetry(0), sluice.WithObserver(m))
		if err != nil {
			t.Fatal(err)
		}
		m.Watch(tr)
		defer tr.Close()
		reg := prometheus.NewPedanticRegistry()
		reg.MustRegister(m)
		for range 3 {
			req, _ := http.NewRequest("GET", "http://api.example.com/v1/messages", nil)
			resp, err := tr.RoundTrip(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
		}
		tr.WaitEvents(context.Background())
		fams, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		if n := value(t, fams, "sluice_overloaded_total", "lane", "api.example.com"); n != 3 {
			t.Errorf("sluice_overloaded_total = %v after three 529s, want 3", n)
		}
	})
}
