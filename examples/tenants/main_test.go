package main

import (
	"bytes"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluice-go/sluice/internal/stats"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// TestFairness runs the three modes in a synctest bubble, where the
// upstream's 100 ms and every wait are on a virtual clock: the run takes
// the CPU time of its calls, not the seconds it simulates, and the timing
// does not depend on how loaded the machine is. So it runs the full
// scenario of TestTenantFairness (scale 1), 20 s of virtual time in under a
// second, and its numbers can be read against the README's table.
func TestFairness(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := config{Scale: 1, Share: 0.25}
		results, err := runAll(t.Context(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		var buf bytes.Buffer
		for _, r := range results {
			printTable(&buf, r.name, r)
		}
		t.Log("\n" + buf.String())

		fifo, turns, share := results[0], results[1], results[2]
		for _, r := range results {
			if got, want := r.big().served, scaledBig(cfg.Scale); got != want {
				t.Errorf("%s: big served %d, want %d", r.name, got, want)
			}
			for _, tn := range r.small() {
				if tn.served != smallCalls {
					t.Errorf("%s: %s served %d, want %d", r.name, tn.id, tn.served, smallCalls)
				}
			}
		}

		// In one FIFO each of the nine waits behind the big tenant's
		// backlog (800 calls at 200 a second: 4 s); taking turns it waits
		// about one turn of the gate per call, well under a second. Less
		// than half is a wide margin.
		fifoBest := slices.Min(smallP99s(fifo))
		for _, r := range []*result{turns, share} {
			if worst := slices.Max(smallP99s(r)); worst >= fifoBest/2 {
				t.Errorf("%s: the nine's worst wait p99 %v, want under half of the best in one FIFO (%v)", r.name, worst, fifoBest)
			}
		}

		// Without a cap the big tenant takes every slot the nine leave; with
		// share 0.25 of 20 it holds at most 5, and does use them.
		if got := turns.big().maxIn; got <= 5 {
			t.Errorf("turns: big held at most %d in flight at the upstream, want more than the cap of the third run", got)
		}
		if got := share.big().maxIn; got > 5 || got < 1 {
			t.Errorf("turns + share: big held at most %d in flight at the upstream, want 1 to 5", got)
		}
		// The cap holds when the big tenant is alone, so it finishes later
		// than with turns alone, where it drains at 20.
		if share.big().doneAt <= turns.big().doneAt {
			t.Errorf("big done at %v with the share, %v without: want later with the cap", share.big().doneAt, turns.big().doneAt)
		}
	})
}

// smallP99s returns the nine's wait p99s.
func smallP99s(r *result) []time.Duration {
	var out []time.Duration
	for _, tn := range r.small() {
		out = append(out, stats.Quantile(tn.waits, 0.99))
	}
	return out
}

// TestRunOutput checks the printed tables' shape, in a bubble too.
func TestRunOutput(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var buf bytes.Buffer
		if err := run(t.Context(), config{Scale: 0.1, Share: 0.5}, &buf); err != nil {
			t.Fatalf("run: %v\n%s", err, buf.String())
		}
		s := buf.String()
		for _, want := range []string{
			"Tenant big sends 100 calls at t=0; nine small tenants send 10 each at t=100ms.",
			"(1) one FIFO: no tenant tags\n",
			"(2) turns: tagged with WithTenant\n",
			"(3) turns + share: tagged, WithTenantShare(Normal, 0.5): at most 10 in flight per tenant\n",
			"Look for:",
		} {
			if !strings.Contains(s, want) {
				t.Errorf("no %q in:\n%s", want, s)
			}
		}
		if n := strings.Count(s, "nine small  10 each"); n != 3 {
			t.Errorf("%d rows for the nine, want one per run:\n%s", n, s)
		}
	})
}

func TestRunRejectsBadFlags(t *testing.T) {
	for _, cfg := range []config{{Scale: 0, Share: 0.25}, {Scale: 6, Share: 0.25}, {Scale: 1, Share: 0}, {Scale: 1, Share: 1.5}} {
		if err := run(t.Context(), cfg, &bytes.Buffer{}); err == nil {
			t.Errorf("run(%+v) succeeded", cfg)
		}
	}
}
