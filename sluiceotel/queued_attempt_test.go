package sluiceotel_test

import (
	"context"
	"net/http"
	"sync"
	"testing"

	"github.com/sluice-go/sluice/sluiceotel"
)

// TestQueuedEventAttempt: a sluice.queued span event states no attempt
// number, which sluice does not report for a queued attempt (its queue's
// length only): sluice.attempt = 0 would name no attempt (1 is a first).
func TestQueuedEventAttempt(t *testing.T) {
	s := newSetup(t)
	up := upstream(t)
	var wg sync.WaitGroup
	for range 4 { // at 50/s from one token, three of them queue
		wg.Go(func() {
			req, _ := http.NewRequest("GET", up.URL+"/", nil)
			if resp, err := s.client.Do(req); err == nil {
				resp.Body.Close()
			}
		})
	}
	wg.Wait()
	if err := s.tr.WaitEvents(context.Background()); err != nil {
		t.Fatal(err)
	}
	queued := 0
	for _, sp := range s.spans.Ended() {
		for _, e := range sp.Events() {
			if e.Name != sluiceotel.EventQueued {
				continue
			}
			queued++
			for _, kv := range e.Attributes {
				if kv.Key == sluiceotel.AttemptKey && kv.Value.AsInt64() < 1 {
					t.Errorf("sluice.queued with sluice.attempt = %d", kv.Value.AsInt64())
				}
			}
		}
	}
	if queued == 0 {
		t.Fatal("no sluice.queued event")
	}
}
