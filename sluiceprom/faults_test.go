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

// failOnce answers the first call of a request with header Fail with a 500
// (retried after a backoff), and every other with 200.
type failOnce struct{ n atomic.Int32 }

func (b *failOnce) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Header.Get("Fail") != "" && b.n.Add(1) == 1 {
		return &http.Response{StatusCode: 500, Header: http.Header{}, Body: http.NoBody, Request: req}, nil
	}
	return &http.Response{StatusCode: 200, Header: http.Header{}, Body: io.NopCloser(strings.NewReader("ok")), Request: req}, nil
}

// TestAbandonedRetryCountersMatchStats: a retry abandoned during its
// backoff (the caller cancels) leaves the lane's counters as they were,
// and the next scrape's match Stats. Had a counter fallen, the scrape would
// take the lane for one made anew and count it twice (granted_total
// doubled).
func TestAbandonedRetryCountersMatchStats(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m, err := sluiceprom.New()
		if err != nil {
			t.Fatal(err)
		}
		tr, err := sluice.New(&failOnce{}, sluice.WithObserver(m))
		if err != nil {
			t.Fatal(err)
		}
		m.Watch(tr)
		defer func() { tr.Close(); tr.WaitEvents(context.Background()) }()
		reg := prometheus.NewPedanticRegistry()
		reg.MustRegister(m)
		const lane = "api.example.com"

		// Nine requests that succeed, one that gets the 500 and waits to
		// retry.
		for range 9 {
			req, _ := http.NewRequest("GET", "http://"+lane+"/x", nil)
			if resp, err := tr.RoundTrip(req); err == nil {
				resp.Body.Close()
			}
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() {
			defer close(done)
			req, _ := http.NewRequestWithContext(ctx, "GET", "http://"+lane+"/x", nil)
			req.Header.Set("Fail", "once")
			if resp, err := tr.RoundTrip(req); err == nil {
				resp.Body.Close()
			}
		}()
		synctest.Wait()
		fams, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		g1 := value(t, fams, "sluice_granted_total", "lane", lane, "priority", "normal")
		r1 := value(t, fams, "sluice_retries_total", "lane", lane)
		cancel() // the caller gives up during the backoff
		<-done
		fams, err = reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		g2 := value(t, fams, "sluice_granted_total", "lane", lane, "priority", "normal")
		r2 := value(t, fams, "sluice_retries_total", "lane", lane)
		st, _ := tr.LaneStats(lane)
		t.Logf("scrape 1: granted %v retries %v; scrape 2: granted %v retries %v; Stats now: granted %d retries %d",
			g1, r1, g2, r2, st.Levels[sluice.Normal].Granted, st.Retries)
		if g2 != float64(st.Levels[sluice.Normal].Granted) {
			t.Errorf("sluice_granted_total = %v, Stats says %d: no request was granted between the scrapes", g2, st.Levels[sluice.Normal].Granted)
		}
	})
}

// TestInvalidUTF8LaneKeyScrapes: the default lane key is req.URL.Host,
// and url.Parse accepts "http://%ff.example.com/" (Host
// "\xff.example.com"); a WithKey reading a header is another way in. Such a
// key is labelled in valid UTF-8, and the registry is scraped with the lane
// and after it is forgotten. A label that is not made a scrape fail for
// the whole registry, for the Metrics' life.
func TestInvalidUTF8LaneKeyScrapes(t *testing.T) {
	m, err := sluiceprom.New()
	if err != nil {
		t.Fatal(err)
	}
	tr, err := sluice.New(nopBase{}, sluice.WithLaneIdle(10*time.Millisecond)) // no Observer needed for this one
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	m.Watch(tr)
	reg := prometheus.NewRegistry()
	reg.MustRegister(m)
	req, err := http.NewRequest("GET", "http://%ff.example.com/x", nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp, err := tr.RoundTrip(req); err == nil {
		resp.Body.Close()
	}
	if _, err := reg.Gather(); err != nil {
		t.Errorf("scrape with the lane: %.200v", err)
	}
	for deadline := time.Now().Add(5 * time.Second); len(tr.Stats().Lanes) > 0 && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	if _, err := reg.Gather(); err != nil {
		t.Errorf("scrape after the lane was forgotten (%d lanes): %.200v", len(tr.Stats().Lanes), err)
	}
}

// TestInvalidUTF8LaneKeyObserved: the events of a lane whose key is not
// valid UTF-8 are observed, and every later event reaches every Observer.
// A label that was not valid UTF-8 made Observe panic with its lock held,
// and the next event blocked the Transport's event goroutine for good.
func TestInvalidUTF8LaneKeyObserved(t *testing.T) {
	m, err := sluiceprom.New()
	if err != nil {
		t.Fatal(err)
	}
	var seen atomic.Int32
	count := sluice.ObserverFunc(func(context.Context, sluice.Event) { seen.Add(1) })
	tr, err := sluice.New(nopBase{}, sluice.WithObserver(m), sluice.WithObserver(count))
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	m.Watch(tr)
	for _, u := range []string{"http://%ff.example.com/x", "http://api.example.com/x", "http://api.example.com/y"} {
		req, err := http.NewRequest("GET", u, nil)
		if err != nil {
			t.Fatal(err)
		}
		if resp, err := tr.RoundTrip(req); err == nil {
			resp.Body.Close()
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := tr.WaitEvents(ctx); err != nil {
		t.Errorf("WaitEvents: %v; the other Observer saw %d of the 3 granted events", err, seen.Load())
	}
}
