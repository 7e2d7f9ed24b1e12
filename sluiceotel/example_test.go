package sluiceotel_test

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"time"

	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/sluiceotel"
)

func Example() {
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "ok")
	}))
	defer api.Close()

	// Your providers; in-memory ones here, to print what they got.
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))

	// The Telemetry first, since the Transport takes it as its Observer;
	// then the Transport, which the Telemetry reads when metrics are
	// collected; otelhttp around it makes the spans that get the events.
	tel, err := sluiceotel.New(sluiceotel.WithMeterProvider(mp))
	if err != nil {
		log.Fatal(err)
	}
	tr, err := sluice.New(nil, sluice.WithRate(100, time.Second), sluice.WithObserver(tel))
	if err != nil {
		log.Fatal(err)
	}
	tel.Watch(tr)
	client := &http.Client{Transport: otelhttp.NewTransport(tr, otelhttp.WithTracerProvider(tp))}

	resp, err := client.Get(api.URL)
	if err != nil {
		log.Fatal(err)
	}
	tr.WaitEvents(context.Background()) // only so the example prints the same each time
	resp.Body.Close()                   // ends the span

	for _, sp := range spans.Ended() {
		for _, e := range sp.Events() {
			fmt.Println("span event:", e.Name)
		}
	}
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		log.Fatal(err)
	}
	for _, m := range rm.ScopeMetrics[0].Metrics {
		if m.Name != "sluice.granted" {
			continue
		}
		for _, p := range m.Data.(metricdata.Sum[int64]).DataPoints {
			if v, _ := p.Attributes.Value("sluice.priority"); v == attribute.StringValue("normal") {
				addr, _ := p.Attributes.Value("server.address")
				fmt.Printf("sluice.granted{server.address=%s, sluice.priority=normal} %d\n", addr.AsString(), p.Value)
			}
		}
	}
	// Output:
	// span event: sluice.granted
	// sluice.granted{server.address=127.0.0.1, sluice.priority=normal} 1
}
