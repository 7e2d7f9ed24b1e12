package sluice_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"time"

	"github.com/sluice-go/sluice"
)

// takeCounter is a Backend that grants every Take and counts them per
// taker: what a Backend that reserves tokens ahead keeps apart.
type takeCounter struct {
	mu sync.Mutex
	n  map[any]int
}

func (b *takeCounter) Take(ctx context.Context, key string, rate float64, burst int) (time.Duration, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.n[sluice.TakerOf(ctx)]++
	return 0, nil
}

func (b *takeCounter) Done(key string) {}

func (b *takeCounter) Cool(ctx context.Context, key string, until time.Time) error { return nil }

// A Backend shared by two Transports tells their lanes' Takes apart with
// TakerOf.
func ExampleTakerOf() {
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer api.Close()
	b := &takeCounter{n: map[any]int{}}
	for _, calls := range []int{1, 3} {
		tr, err := sluice.New(nil, sluice.WithBackend(b), sluice.WithRate(100, time.Second))
		if err != nil {
			fmt.Println(err)
			return
		}
		for range calls {
			resp, err := (&http.Client{Transport: tr}).Get(api.URL)
			if err != nil {
				fmt.Println(err)
				return
			}
			resp.Body.Close()
		}
		tr.Close()
		tr.CloseIdleConnections()
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	fmt.Println(len(b.n), "takers")
	for _, n := range b.n {
		if n == 3 {
			fmt.Println("one of them took 3 tokens")
		}
	}
	// Output:
	// 2 takers
	// one of them took 3 tokens
}
