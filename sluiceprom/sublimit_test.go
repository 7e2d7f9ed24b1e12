package sluiceprom_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/sluiceprom"
)

// A sub-limit's name past 64 bytes is cut at a character's start: the
// exporter makes a label value of it, which must be UTF-8 for a scrape to
// succeed.
func TestSublimitNameUTF8(t *testing.T) {
	m, err := sluiceprom.New()
	if err != nil {
		t.Fatal(err)
	}
	tr := newTransport(t, m)
	srv := upstream(t)
	name := strings.Repeat("m", 63) + "é" // 65 bytes: cut in the middle of é
	get(sluice.WithSublimit(context.Background(), name), tr, srv.URL)
	scrapes(t, m)
}

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
	scrapes(t, m)
}

// scrapes registers m in a registry of its own and gathers it once: the
// test fails if the scrape fails or panics.
func scrapes(t *testing.T, m *sluiceprom.Metrics) {
	t.Helper()
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
