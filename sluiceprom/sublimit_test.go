package sluiceprom_test

import (
	"context"
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
