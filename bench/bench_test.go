package main

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"strings"
	"testing"
	"time"
)

// TestMain lets the test binary serve a model for run, as the bench's
// binary does (see startRemote).
func TestMain(m *testing.M) {
	serveIfChild()
	os.Exit(m.Run())
}

// TestShort is the CI smoke test: one model, every client, about 1.5 s a
// run over real loopback. It checks that the instrument works (every run
// completes, the table is written, the hand-made x/time/rate pair gets a
// sensible share), not how well any client paces.
func TestShort(t *testing.T) {
	if testing.Short() {
		t.Skip("real-clock runs")
	}
	ms, cs, err := selectRuns("^strict GCRA burst 1, same headers", "")
	if err != nil {
		t.Fatal(err)
	}
	cfg := config{d: 1500 * time.Millisecond, workers: 32, latency: 20 * time.Millisecond}
	var out bytes.Buffer
	if err := bench(t.Context(), &out, io.Discard, cfg, ms, cs); err != nil {
		t.Fatal(err)
	}
	checkTable(t, out.String(), cs, func(c client) string { return c.name })
	// x/time/rate at R against a strict limiter: a share of the rate with
	// many refusals, whatever the load of the machine (wide slack).
	_, pair, err := selectRuns("", "^x/time/rate")
	if err != nil {
		t.Fatal(err)
	}
	r := run(t.Context(), cfg, ms[0], pair[0])
	if r.err != nil || r.attempts == 0 || r.ratio < 0.2 || r.ratio > 1.1 {
		t.Errorf("x/time/rate at R: %+v", r)
	}
}

// TestModelsBesidePeers guards every server model on real loopback: sluice
// at R beside x/time/rate + 16 slots at R, one after the other in the same
// test, 8 s runs with the second half measured. Its bounds are ratios
// between the two, with slack for a loaded runner, never absolute rates:
// where the pair keeps the limit, sluice serves at least 0.85 of what it
// serves and refuses at most 2% of its attempts; against a strict server
// (the pair refused 10% or more), sluice refuses a quarter of the pair's
// share at most and serves 0.8 of it at least (one refusal costs a
// second's Retry-After, a quarter of the measured half); during a
// secondary limit's penalty it sends one request at most.
func TestModelsBesidePeers(t *testing.T) {
	if testing.Short() {
		t.Skip("real-clock runs")
	}
	_, cs, err := selectRuns("", "^(sluice at R|x/time/rate at R)")
	if err != nil || len(cs) != 2 {
		t.Fatalf("selectRuns: %d clients, %v", len(cs), err)
	}
	ms := projectModels()
	cfg := config{d: 8 * time.Second, workers: 32, latency: 20 * time.Millisecond}
	for _, m := range ms {
		t.Run(m.name, func(t *testing.T) {
			// A strict server's first refusals set where a lane without a
			// rate starts learning from, and the measured half of a short
			// run shows how far it got: up to three runs, the first
			// within the bounds ends it.
			var fail string
			for try := range 3 {
				s, x := run(t.Context(), cfg, m, cs[0]), run(t.Context(), cfg, m, cs[1])
				if s.err != nil || x.err != nil || s.attempts == 0 || x.attempts == 0 {
					t.Fatalf("sluice %+v, x/time/rate %+v", s, x)
				}
				t.Logf("run %d: sluice at R %v; x/time/rate at R + 16 slots %v", try, s, x)
				fail = ""
				switch {
				case m.penalty > 0:
					if s.inPenalty > 1 {
						fail = fmt.Sprintf("sluice sent %d in the penalty, want at most 1", s.inPenalty)
					}
					if x.inPenalty <= 1 {
						t.Fatalf("x/time/rate sent %d in the penalty: the penalty did not start", x.inPenalty)
					}
				case x.refused >= 10:
					if s.refused > x.refused/4 || s.ratio < 0.8*x.ratio {
						fail = fmt.Sprintf("strict server: sluice %.2f of R with %.1f%% refused, x/time/rate %.2f with %.1f%%",
							s.ratio, s.refused, x.ratio, x.refused)
					}
				default:
					if s.refused > 2 || s.ratio < 0.85*x.ratio {
						fail = fmt.Sprintf("sluice %.2f of R with %.1f%% refused, x/time/rate %.2f", s.ratio, s.refused, x.ratio)
					}
				}
				if fail == "" {
					return
				}
			}
			t.Errorf("three runs in a row; the last: %s", fail)
		})
	}
}

func TestSelectRuns(t *testing.T) {
	if _, _, err := selectRuns("no such model", ""); err == nil {
		t.Error("no error for a regexp that matches no model")
	}
	if _, _, err := selectRuns("(", ""); err == nil {
		t.Error("no error for a bad regexp")
	}
	ms, cs, err := selectRuns("", "")
	if err != nil || len(ms) != len(projectModels())+len(realModels()) || len(projectModels()) != 10 || len(realModels()) != 32 || len(cs) != 6 {
		t.Errorf("selectRuns(all) = %d models, %d clients, %v", len(ms), len(cs), err)
	}
	// The child process finds its model by name.
	seen := map[string]bool{}
	for _, m := range ms {
		if seen[m.name] || (m.make == nil) == (m.mw == nil) {
			t.Errorf("model %q: a second of that name, or not exactly one of make and mw", m.name)
		}
		seen[m.name] = true
	}
}

// TestTokensShort is the token table's smoke test: both scenarios, both
// clients, 2 s a run over real loopback. It checks the instrument (every
// run completes with attempts measured, the table is written, the peers
// by hand serve a sensible share of the token budget), not how well any
// client paces.
func TestTokensShort(t *testing.T) {
	if testing.Short() {
		t.Skip("real-clock runs")
	}
	ss, cs, err := selectTokenRuns("", "")
	if err != nil || len(ss) != 2 || len(cs) != 2 {
		t.Fatalf("selectTokenRuns(all) = %d scenarios, %d clients, %v", len(ss), len(cs), err)
	}
	cfg := config{d: 2 * time.Second, latency: 20 * time.Millisecond}
	var out bytes.Buffer
	if err := benchTokens(t.Context(), &out, io.Discard, cfg, ss, cs); err != nil {
		t.Fatal(err)
	}
	checkTable(t, out.String(), cs, func(c tokenClient) string { return c.name })
	for _, s := range ss {
		r := runTokens(t.Context(), cfg, s, cs[1])
		if r.err != nil || r.attempts == 0 || r.tokenShare < 0.3 || r.tokenShare > 1.5 {
			t.Errorf("%s, %s: %+v", s.name, cs[1].name, r)
		}
	}
	if _, _, err := selectTokenRuns("^strict GCRA", ""); err == nil {
		t.Error("a request model selected a token scenario")
	}
}

// checkTable logs a printed table and checks it has a column per client,
// named by name, and no failed run.
func checkTable[C any](t *testing.T, table string, cs []C, name func(C) string) {
	t.Helper()
	t.Log(table)
	for _, c := range cs {
		if !strings.Contains(table, "| "+name(c)+" |") {
			t.Errorf("table has no column %q", name(c))
		}
	}
	if strings.Contains(table, "error:") {
		t.Errorf("a run failed:\n%s", table)
	}
}
