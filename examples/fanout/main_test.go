package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// TestMain checks that the demo leaves no goroutine behind: its embedded
// upstream, its connections and its progress bar all stop with run.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// short is the demo shrunk for tests: few items at a high rate, so that a
// run takes well under a second.
func short(items int) config {
	cfg := defaultConfig()
	cfg.Items, cfg.Rate, cfg.Latency, cfg.Report = items, 1000, 5*time.Millisecond, 0
	return cfg
}

// field returns the value of a summary line "name   value".
func field(t *testing.T, out, name string) string {
	t.Helper()
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + `\s{2,}(.*)$`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no %q line in the output:\n%s", name, out)
	}
	return m[1]
}

func TestRunEmbeddedUpstream(t *testing.T) {
	var out bytes.Buffer
	if err := run(t.Context(), short(300), &out); err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	s := out.String()
	t.Log("\n" + s)
	if got := field(t, s, "items"); got != "300 done of 300" {
		t.Errorf("items: %q", got)
	}
	for _, name := range []string{"wall time", "achieved rate", "429s", "retries", "cooldowns", "in-flight limit"} {
		field(t, s, name)
	}
	// One in ten items is Interactive, three in ten Normal, the rest Batch.
	for _, row := range []string{"interactive", "normal", "batch"} {
		cols := strings.Fields(field(t, s, row))
		want := map[string]string{"interactive": "30", "normal": "90", "batch": "180"}[row]
		if len(cols) != 3 || cols[0] != want {
			t.Errorf("%s row: %q, want %s items and two waits", row, cols, want)
		}
	}
}

// TestRunURL points the demo at an API of the test's own, as -url does: no
// embedded upstream starts, every item's URL is requested once, and
// failures are counted without ending the run.
func TestRunURL(t *testing.T) {
	var mu sync.Mutex
	seen := map[string]int{}
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen[r.URL.Path]++
		mu.Unlock()
		if strings.HasSuffix(r.URL.Path, "7") {
			http.NotFound(w, r)
		}
	}))
	defer api.Close()

	cfg := short(50)
	cfg.URL = api.URL + "/things/{item}"
	var out bytes.Buffer
	if err := run(t.Context(), cfg, &out); err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	s := out.String()
	if got := field(t, s, "items"); got != "50 done (5 failed: 5 x 404) of 50" {
		t.Errorf("items: %q", got)
	}
	if strings.Contains(s, "embedded") || strings.Contains(s, "upstream accepted") {
		t.Errorf("an embedded upstream was described with -url:\n%s", s)
	}
	mu.Lock()
	defer mu.Unlock()
	for i := range 50 {
		if n := seen[fmt.Sprintf("/things/%d", i)]; n != 1 {
			t.Errorf("item %d requested %d times", i, n)
		}
	}
}

// TestRunInterrupted cancels the run as Ctrl-C does: it stops, prints the
// summary so far, and returns the context's error.
func TestRunInterrupted(t *testing.T) {
	cfg := short(100_000)
	cfg.Rate = 200
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	time.AfterFunc(300*time.Millisecond, cancel)
	var out bytes.Buffer
	err := run(ctx, cfg, &out)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("run = %v, want context.Canceled", err)
	}
	s := out.String()
	if !strings.Contains(s, "interrupted") {
		t.Errorf("no word of the interruption:\n%s", s)
	}
	var done int
	if _, err := fmt.Sscanf(field(t, s, "items"), "%d done", &done); err != nil || done <= 0 || done >= cfg.Items {
		t.Errorf("items: %q, want some but not all done", field(t, s, "items"))
	}
}

// TestRunProgressBar runs with the bar on (into a buffer, which is not a
// terminal: the bar draws its last frame at the end).
func TestRunProgressBar(t *testing.T) {
	cfg := short(100)
	cfg.Progress = true
	var out bytes.Buffer
	if err := run(t.Context(), cfg, &out); err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	if s := out.String(); !strings.Contains(s, "100 / 100") || !strings.Contains(s, "100 done of 100") {
		t.Errorf("no final bar or summary:\n%s", s)
	}
}

func TestRunRejectsBadFlags(t *testing.T) {
	cfg := short(10)
	cfg.Rate = 0
	if err := run(t.Context(), cfg, &bytes.Buffer{}); err == nil {
		t.Error("run with -rate 0 succeeded")
	}
}

// TestRunStatusPage runs with -status on a free port: the page is served
// while the items fan out, its feed shows the demo's lane at work, and the
// server is gone when run returns.
func TestRunStatusPage(t *testing.T) {
	cfg := short(400)
	cfg.Rate = 200 // 2 s of work
	cfg.Status = "127.0.0.1:0"
	cfg.statusInterval = 50 * time.Millisecond
	type seen struct {
		page    string
		granted uint64
		err     error
	}
	got := make(chan seen, 1)
	var addr string
	cfg.statusUp = func(url string) {
		addr = url
		go func() {
			var s seen
			defer func() { got <- s }()
			resp, err := http.Get(url)
			if err != nil {
				s.err = err
				return
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			s.page = string(b)
			// Poll the feed until the lane has granted something.
			for range 100 {
				time.Sleep(20 * time.Millisecond)
				resp, err := http.Get(url + "?format=json")
				if err != nil {
					s.err = err
					return
				}
				var f struct {
					Shown []struct {
						Levels []struct {
							Granted uint64 `json:"granted"`
						} `json:"levels"`
					} `json:"shown"`
				}
				err = json.NewDecoder(resp.Body).Decode(&f)
				resp.Body.Close()
				if err != nil {
					s.err = err
					return
				}
				if len(f.Shown) == 1 {
					for _, lv := range f.Shown[0].Levels {
						s.granted += lv.Granted
					}
					if s.granted > 0 {
						return
					}
				}
			}
		}()
	}
	var out bytes.Buffer
	if err := run(t.Context(), cfg, &out); err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	s := <-got
	if s.err != nil || !strings.Contains(s.page, "<svg") || s.granted == 0 {
		t.Errorf("status page: err %v, %d bytes of page, %d granted in its feed", s.err, len(s.page), s.granted)
	}
	if !strings.Contains(out.String(), "status page: "+addr+"\n") {
		t.Errorf("the address %s is not printed:\n%s", addr, out.String())
	}
	if _, err := http.Get(addr); err == nil {
		t.Errorf("the status page is still served after run")
	}
}
