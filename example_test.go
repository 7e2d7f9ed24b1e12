package sluice_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"time"

	"github.com/sluice-go/sluice"
)

func ExampleNew() {
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "hello")
	}))
	defer api.Close()

	// 500 requests per minute, the allowance an API's account page publishes.
	tr, err := sluice.New(nil, sluice.WithRate(500, time.Minute))
	if err != nil {
		log.Fatal(err)
	}
	client := &http.Client{Transport: tr}

	resp, err := client.Get(api.URL)
	if err != nil {
		log.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	fmt.Println(resp.StatusCode, string(body))
	// Output: 200 hello
}

func ExampleNew_invalidOption() {
	_, err := sluice.New(nil, sluice.WithRate(500, 0))
	fmt.Println(err)
	// Output: sluice: invalid option: WithRate(500, 0s): per must be positive
}

func ExampleWithPriority() {
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer api.Close()
	tr, err := sluice.New(nil, sluice.WithRate(10, time.Second))
	if err != nil {
		log.Fatal(err)
	}
	client := &http.Client{Transport: tr}

	// A request handler marks its calls Interactive; a batch job marks its
	// own Batch. Waiting calls are served Interactive first, FIFO within a
	// level. A context with no priority is Normal.
	ctx := sluice.WithPriority(context.Background(), sluice.Interactive)
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, api.URL, nil)
	resp, err := client.Do(req)
	if err != nil {
		log.Fatal(err)
	}
	resp.Body.Close()

	fmt.Println(sluice.PriorityFrom(ctx), sluice.PriorityFrom(context.Background()))
	// Output: interactive normal
}

func ExampleWithTenant() {
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer api.Close()

	// A service calls one API for many customers. Each customer may hold at
	// most a quarter of the in-flight limit, and customers take turns, so
	// one customer's flood does not hold up the others.
	tr, err := sluice.New(nil,
		sluice.WithRate(100, time.Second),
		sluice.WithConcurrency(8, 8),
		sluice.WithTenantShare(sluice.Normal, 0.25),
		sluice.WithTenantQueue(1000), // refuse a customer's 1,001st queued call at once
	)
	if err != nil {
		log.Fatal(err)
	}
	client := &http.Client{Transport: tr}

	var wg sync.WaitGroup
	for _, customer := range []string{"acme", "acme", "acme", "globex"} {
		wg.Go(func() {
			ctx := sluice.WithTenant(context.Background(), customer)
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, api.URL, nil)
			resp, err := client.Do(req)
			if err != nil {
				log.Print(err)
				return
			}
			resp.Body.Close()
		})
	}
	wg.Wait()

	// All four were served; the tenants, now idle, are forgotten.
	lane, _ := tr.Stats().Lane(strings.TrimPrefix(api.URL, "http://"))
	fmt.Println(lane.Levels[sluice.Normal].Granted, lane.Levels[sluice.Normal].Tenants)
	// Output: 4 0
}
