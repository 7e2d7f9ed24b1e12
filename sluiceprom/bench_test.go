package sluiceprom_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/sluiceprom"
)

type nopBase struct{}

func (nopBase) RoundTrip(req *http.Request) (*http.Response, error) {
	return &http.Response{StatusCode: 200, Body: http.NoBody, Request: req}, nil
}

// BenchmarkRoundTrip measures what a Metrics as Observer adds to sluice's
// fast path (token and slot free, nobody waiting), beside no Observer and
// an Observer that does nothing. The Observer runs on the Transport's event
// goroutine, so what the request pays is the event's hand-off; the
// histogram's cost shows in the parallel runs, where that goroutine
// competes for the cores.
func BenchmarkRoundTrip(b *testing.B) {
	req, _ := http.NewRequest("GET", "http://api.test/", nil)
	mk := func(opts ...sluice.Option) *sluice.Transport {
		tr, err := sluice.New(nopBase{}, append([]sluice.Option{sluice.WithRate(1e9, time.Second), sluice.WithBurst(1 << 30)}, opts...)...)
		if err != nil {
			b.Fatal(err)
		}
		return tr
	}
	m, err := sluiceprom.New()
	if err != nil {
		b.Fatal(err)
	}
	prom := mk(sluice.WithObserver(m))
	m.Watch(prom)
	variants := []struct {
		name string
		tr   *sluice.Transport
	}{
		{"sluice", mk()},
		{"sluice+nop-observer", mk(sluice.WithObserver(sluice.ObserverFunc(func(context.Context, sluice.Event) {})))},
		{"sluice+sluiceprom", prom},
	}
	for _, v := range variants {
		run := func(b *testing.B) {
			resp, err := v.tr.RoundTrip(req)
			if err != nil {
				b.Fatal(err)
			}
			resp.Body.Close()
		}
		// dropped reports the events the Observer missed for falling
		// behind: a cost hidden from ns/op.
		dropped := func(b *testing.B, from uint64) {
			v.tr.WaitEvents(context.Background())
			b.ReportMetric(float64(v.tr.Stats().EventsDropped-from)/float64(b.N), "dropped/op")
		}
		b.Run(v.name, func(b *testing.B) {
			b.ReportAllocs()
			from := v.tr.Stats().EventsDropped
			for b.Loop() {
				run(b)
			}
			dropped(b, from)
		})
		b.Run(v.name+"/parallel", func(b *testing.B) {
			b.ReportAllocs()
			from := v.tr.Stats().EventsDropped
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					run(b)
				}
			})
			dropped(b, from)
		})
	}
	for _, v := range variants {
		v.tr.Close()
	}
}

// BenchmarkObserve measures a Metrics' Observer alone, per granted event:
// the work the Transport's event goroutine does for it.
func BenchmarkObserve(b *testing.B) {
	m, err := sluiceprom.New()
	if err != nil {
		b.Fatal(err)
	}
	e := sluice.Event{Kind: sluice.EventGranted, Time: time.Now(), Lane: "api.test", Priority: sluice.Normal, Attempt: 1, Wait: 3 * time.Millisecond}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		m.Observe(ctx, e)
	}
}
