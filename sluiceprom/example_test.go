package sluiceprom_test

import (
	"bufio"
	"context"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/sluiceprom"
)

func Example() {
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "ok")
	}))
	defer api.Close()

	// The Metrics first, since the Transport takes it as its Observer; then
	// the Transport, which the Metrics reads at each scrape. Every lane is
	// labelled "api" here; by default the label is the lane's key, the host.
	m, err := sluiceprom.New(sluiceprom.WithLaneLabel(func(string) string { return "api" }))
	if err != nil {
		log.Fatal(err)
	}
	tr, err := sluice.New(nil, sluice.WithRate(100, time.Second), sluice.WithObserver(m))
	if err != nil {
		log.Fatal(err)
	}
	m.Watch(tr)
	reg := prometheus.NewRegistry()
	reg.MustRegister(m)
	metrics := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{})) // your /metrics
	defer metrics.Close()

	client := &http.Client{Transport: tr}
	for range 3 {
		resp, err := client.Get(api.URL)
		if err != nil {
			log.Fatal(err)
		}
		resp.Body.Close()
	}
	tr.WaitEvents(context.Background()) // the histogram is fed by events, a moment late

	resp, err := http.Get(metrics.URL)
	if err != nil {
		log.Fatal(err)
	}
	defer resp.Body.Close()
	for sc := bufio.NewScanner(resp.Body); sc.Scan(); {
		line := sc.Text()
		if strings.HasPrefix(line, "sluice_granted_total{") || strings.HasPrefix(line, "sluice_wait_seconds_count{") ||
			strings.HasPrefix(line, "sluice_rate_ceiling_per_second{") {
			fmt.Println(line)
		}
	}
	// Output:
	// sluice_granted_total{lane="api",priority="batch"} 0
	// sluice_granted_total{lane="api",priority="interactive"} 0
	// sluice_granted_total{lane="api",priority="normal"} 3
	// sluice_rate_ceiling_per_second{lane="api"} 100
	// sluice_wait_seconds_count{lane="api",priority="batch"} 0
	// sluice_wait_seconds_count{lane="api",priority="interactive"} 0
	// sluice_wait_seconds_count{lane="api",priority="normal"} 3
}
