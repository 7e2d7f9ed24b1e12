package sluiceprom_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-go/sluice/sluiceprom"
)

// TestSublimitFromPathUTF8: a server that names a Discord-style bucket
// (kept per major parameter of the route) makes a sub-limit named after a
// path segment, which a request can spell in any bytes (%FF): the
// exporter's label is still valid UTF-8, and the scrape succeeds.
func TestSublimitFromPathUTF8(t *testing.T) {
	m, err := sluiceprom.New()
	if err != nil {
		t.Fatal(err)
	}
	tr := newTransport(t, m)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-RateLimit-Bucket", "abcd1234")
		w.Header().Set("X-RateLimit-Limit", "5")
		w.Header().Set("X-RateLimit-Remaining", "4")
		w.Header().Set("X-RateLimit-Reset-After", "1")
		fmt.Fprint(w, "ok")
	}))
	t.Cleanup(srv.Close)
	for range 3 {
		if err := get(context.Background(), tr, srv.URL+"/api/v10/channels/%FF42/messages"); err != nil {
			t.Fatal(err)
		}
	}
	s := tr.Stats()
	for _, ls := range s.Lanes {
		t.Logf("lane %q sublimit %q", ls.Key, ls.Sublimit)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(m)
	defer func() {
		if r := recover(); r != nil {
			t.Errorf("a scrape panicked: %v", r)
		}
	}()
	if _, err := reg.Gather(); err != nil {
		t.Errorf("a scrape failed: %v", err)
	}
}
