package browsertest

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
	"go.uber.org/goleak"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/sluicestatus"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// browser returns the path of a headless Chromium, or skips the test (fails
// it when SLUICE_REQUIRE_BROWSER=1).
func browser(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("SLUICE_CHROME"); p != "" {
		return p
	}
	for _, name := range []string{"chromium-headless-shell", "/usr/lib/chromium/chromium-headless-shell", "chromium", "headless_shell"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	msg := "no headless Chromium: install Debian's chromium-headless-shell or set SLUICE_CHROME"
	if os.Getenv("SLUICE_REQUIRE_BROWSER") == "1" {
		t.Fatal(msg + " (SLUICE_REQUIRE_BROWSER=1)")
	}
	t.Skip(msg)
	return ""
}

// upstream is an API that allows limit requests per one-second window and
// answers the rest 429 with Retry-After: 1, after a latency of 20 to 80 ms.
func upstream(limit int) *httptest.Server {
	var mu sync.Mutex
	var window time.Time
	var n int
	return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		now := time.Now()
		mu.Lock()
		if now.Sub(window) >= time.Second {
			window, n = now, 0
		}
		n++
		over := n > limit
		mu.Unlock()
		if over {
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusTooManyRequests)
			return
		}
		time.Sleep(time.Duration(20+rand.IntN(60)) * time.Millisecond)
		io.WriteString(w, "ok")
	}))
}

// work calls through tr from n goroutines until ctx ends, at mixed
// priorities, and returns a func that waits for them.
func work(ctx context.Context, tr *sluice.Transport, url string, n int) (wait func()) {
	client := &http.Client{Transport: tr}
	var wg sync.WaitGroup
	for g := range n {
		wg.Go(func() {
			for i := 0; ctx.Err() == nil; i++ {
				p := sluice.Batch
				switch (g + i) % 10 {
				case 0:
					p = sluice.Interactive
				case 1, 4, 7:
					p = sluice.Normal
				}
				req, _ := http.NewRequestWithContext(sluice.WithPriority(ctx, p), http.MethodGet, url, nil)
				resp, err := client.Do(req)
				if err != nil {
					continue // the context's end, or a refusal
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		})
	}
	return wg.Wait
}

// figures is what the test reads off the page.
type figures struct {
	Lanes      int     `json:"lanes"`
	Points     int     `json:"points"`     // samples drawn in the rate chart
	Segments   int     `json:"segments"`   // line segments drawn in the rate chart
	QueuePaths int     `json:"queuePaths"` // lines drawn in the queue chart
	WaitPaths  int     `json:"waitPaths"`  // lines drawn in the wait chart
	Width      float64 `json:"width"`      // of the rate chart on screen
	Granted    int     `json:"granted"`    // the levels' granted, added up
	Achieved   string  `json:"achieved"`
	Updated    string  `json:"updated"`
}

// rate is the achieved rate shown, per second.
func (f figures) rate() float64 {
	a, _ := strconv.ParseFloat(strings.TrimSuffix(f.Achieved, "/s"), 64)
	return a
}

const readFigures = `(() => {
  const lane = document.querySelector("section.lane");
  if (!lane) return {lanes: 0};
  const rate = lane.querySelector('svg.chart[data-chart="rate"]');
  const line = rate && rate.querySelector("path.line:last-of-type");
  const num = s => parseInt(String(s).replace(/[^0-9]/g, ""), 10) || 0;
  let granted = 0;
  lane.querySelectorAll('[data-figure^="granted-"]').forEach(td => granted += num(td.textContent));
  return {
    lanes: document.querySelectorAll("section.lane").length,
    points: rate ? +rate.dataset.points : 0,
    segments: line ? (line.getAttribute("d").match(/L/g) || []).length : 0,
    queuePaths: lane.querySelectorAll('svg.chart[data-chart="queue"] path.line').length,
    waitPaths: lane.querySelectorAll('svg.chart[data-chart="wait"] path.line').length,
    width: rate ? rate.getBoundingClientRect().width : 0,
    granted: granted,
    achieved: (lane.querySelector('[data-figure="achieved"]') || {}).textContent || "",
    updated: document.getElementById("conn").textContent,
  };
})()`

// TestStatusPage loads the page against a live Transport under load and
// checks that it draws its charts, that its figures move as the lane works,
// and that it fetches nothing outside its own origin and throws no error.
func TestStatusPage(t *testing.T) {
	exe := browser(t)

	api := upstream(40)
	defer api.Close()
	base := http.DefaultTransport.(*http.Transport).Clone()
	defer base.CloseIdleConnections()
	// sluice is told 50/s, the server allows 40: the page has 429s and
	// cooldowns to show, and the rate finding the server's pace.
	tr, err := sluice.New(base, sluice.WithRate(50, time.Second), sluice.WithBurst(2), sluice.WithRetry(3))
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	interval := 250 * time.Millisecond
	png := os.Getenv("SLUICE_STATUS_PNG")
	if png != "" {
		interval = time.Second
	}
	status, err := sluicestatus.New(tr, sluicestatus.WithInterval(interval), sluicestatus.WithHistory(2*time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	defer status.Close()
	mux := http.NewServeMux()
	mux.Handle("/debug/sluice/", http.StripPrefix("/debug/sluice", status))
	ops := httptest.NewServer(mux)
	defer ops.Close()

	loadCtx, stopLoad := context.WithCancel(context.Background())
	waitLoad := work(loadCtx, tr, api.URL+"/items", 30)
	defer waitLoad()
	defer stopLoad()

	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(),
		chromedp.ExecPath(exe),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-extensions", true),
		chromedp.Flag("hide-scrollbars", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1280, windowHeight(png)),
	)
	defer cancelAlloc()
	ctx, cancel := chromedp.NewContext(allocCtx, chromedp.WithErrorf(t.Logf))
	defer cancel()

	// What the page asks for, and what it throws. Listen starts the
	// browser: its context has no timeout, which would stop the browser.
	var mu sync.Mutex
	var requests, exceptions []string
	err = chromedp.Listen(ctx, func(ev any) {
		mu.Lock()
		defer mu.Unlock()
		switch e := ev.(type) {
		case *network.EventRequestWillBeSent:
			requests = append(requests, e.Request.URL)
		case *runtime.EventExceptionThrown:
			exceptions = append(exceptions, (&chromedp.ExceptionError{ExceptionDetails: e.ExceptionDetails}).Error())
		case *runtime.EventConsoleAPICalled:
			if e.Type == runtime.ConsoleAPICalledTypeError {
				exceptions = append(exceptions, "console.error")
			}
		}
	})
	if err != nil {
		t.Fatalf("starting %s: %v", exe, err)
	}

	failed := true
	defer func() {
		if failed || t.Failed() {
			shoot(t, ctx, failureShot(t))
		}
	}()

	page := ops.URL + "/debug/sluice/"
	wctx, cancelWait := context.WithTimeout(ctx, 60*time.Second)
	defer cancelWait()
	if err := chromedp.Do(wctx,
		chromedp.Navigate(page),
		chromedp.WaitVisible(chromedp.CSS(`svg.chart[data-chart="rate"] path.line`)),
	); err != nil {
		t.Fatalf("loading %s: %v", page, err)
	}
	first, err := chromedp.Run(wctx, chromedp.Evaluate[figures](readFigures))
	if err != nil {
		t.Fatal(err)
	}
	// A few samples later: at least 4 more drawn, or what there is after
	// 20 s (a machine under load may be slow; the checks below then say
	// what did not move).
	// The rate shown is 0 while the lane cools down after a 429: some
	// read must show it positive.
	later, sawRate := first, first.rate() > 0
	for deadline := time.Now().Add(20 * time.Second); ; {
		time.Sleep(interval)
		later, err = chromedp.Run(wctx, chromedp.Evaluate[figures](readFigures))
		if err != nil {
			t.Fatal(err)
		}
		sawRate = sawRate || later.rate() > 0
		// The page's clock shows whole seconds: four samples may all fall
		// in the second of the first read.
		if later.Points >= first.Points+4 && later.Granted > first.Granted && sawRate && later.Updated != first.Updated ||
			time.Now().After(deadline) {
			break
		}
	}
	t.Logf("first: %+v", first)
	t.Logf("later: %+v", later)

	if later.Lanes != 1 {
		t.Errorf("%d lanes on the page, want 1", later.Lanes)
	}
	if later.Width < 200 {
		t.Errorf("the rate chart is %v px wide on screen", later.Width)
	}
	if later.Points <= first.Points || later.Segments < 3 {
		t.Errorf("rate chart: %d then %d samples, %d segments drawn; want more samples over time and a line of them", first.Points, later.Points, later.Segments)
	}
	if later.QueuePaths != 3 || later.WaitPaths != 3 {
		t.Errorf("queue and wait charts draw %d and %d lines, want one per priority level (3)", later.QueuePaths, later.WaitPaths)
	}
	if later.Granted <= first.Granted || first.Granted <= 0 {
		t.Errorf("granted on the page: %d then %d, want it growing as the lane works", first.Granted, later.Granted)
	}
	if later.Updated == first.Updated || !strings.HasPrefix(later.Updated, "updated ") {
		t.Errorf("the page's clock: %q then %q", first.Updated, later.Updated)
	}
	if !sawRate {
		t.Errorf("the achieved rate shown was never positive (last %q)", later.Achieved)
	}

	if png != "" {
		time.Sleep(loadTime(png))
		// Scroll to the top and give the page a poll to settle.
		time.Sleep(2 * interval)
		shoot(t, ctx, png)
	}

	mu.Lock()
	defer mu.Unlock()
	if len(requests) < 3 {
		t.Errorf("the page made %d requests, want the page and its polls", len(requests))
	}
	for _, u := range requests {
		if !strings.HasPrefix(u, ops.URL+"/") {
			t.Errorf("the page fetched %s, outside its origin %s", u, ops.URL)
		}
	}
	if len(exceptions) > 0 {
		t.Errorf("the page threw: %q", exceptions)
	}
	failed = false
}

// windowHeight is the browser window's: the docs' screenshot is of the
// whole page, which is shorter than a test's window.
func windowHeight(png string) int {
	if png != "" {
		return 600
	}
	return 1000
}

// loadTime is how long the load runs before the docs' screenshot.
func loadTime(png string) time.Duration {
	if png == "" {
		return 0
	}
	if s, err := strconv.Atoi(os.Getenv("SLUICE_STATUS_SECONDS")); err == nil && s > 0 {
		return time.Duration(s) * time.Second
	}
	return 90 * time.Second
}

// failureShot is where a failing run's screenshot goes.
func failureShot(t *testing.T) string {
	dir := os.Getenv("SLUICE_SCREENSHOT_DIR")
	if dir == "" {
		dir = os.TempDir()
	}
	return filepath.Join(dir, fmt.Sprintf("sluice-status-%s-%d.png", t.Name(), time.Now().Unix()))
}

// shoot writes a screenshot of the whole page to path, and says where.
func shoot(t *testing.T, ctx context.Context, path string) {
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	buf, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Logf("no screenshot: %v", err)
		return
	}
	if err := os.WriteFile(path, buf, 0o644); err != nil {
		t.Logf("writing the screenshot: %v", err)
		return
	}
	t.Logf("screenshot of the page: %s", path)
}

// TestStatusPageLaneNames: lanes whose keys are names a JavaScript object
// has of its own ("__proto__", "constructor", "toString"; a key may come
// from a request, as WithKey allows) are drawn like any other, beside an
// ordinary one, and the page keeps updating.
func TestStatusPageLaneNames(t *testing.T) {
	exe := browser(t)
	api := upstream(1000)
	defer api.Close()
	base := http.DefaultTransport.(*http.Transport).Clone()
	defer base.CloseIdleConnections()
	names := []string{"__proto__", "constructor", "toString", "api.example.com"}
	tr, err := sluice.New(base, sluice.WithRate(20, time.Second),
		sluice.WithKey(func(r *http.Request) string { return strings.TrimPrefix(r.URL.Path, "/") }))
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	status, err := sluicestatus.New(tr, sluicestatus.WithInterval(250*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer status.Close()
	ops := httptest.NewServer(status)
	defer ops.Close()

	loadCtx, stopLoad := context.WithCancel(context.Background())
	var waits []func()
	for _, n := range names {
		waits = append(waits, work(loadCtx, tr, api.URL+"/"+n, 2))
	}
	defer func() {
		stopLoad()
		for _, w := range waits {
			w()
		}
	}()

	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(),
		chromedp.ExecPath(exe), chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU,
		chromedp.NoFirstRun, chromedp.NoDefaultBrowserCheck, chromedp.UserDataDir(t.TempDir()))
	defer cancelAlloc()
	ctx, cancel := chromedp.NewContext(allocCtx, chromedp.WithErrorf(t.Logf))
	defer cancel()
	var mu sync.Mutex
	var exceptions []string
	if err := chromedp.Listen(ctx, func(ev any) {
		if e, ok := ev.(*runtime.EventExceptionThrown); ok {
			mu.Lock()
			exceptions = append(exceptions, (&chromedp.ExceptionError{ExceptionDetails: e.ExceptionDetails}).Error())
			mu.Unlock()
		}
	}); err != nil {
		t.Fatalf("starting %s: %v", exe, err)
	}
	wctx, cancelWait := context.WithTimeout(ctx, 60*time.Second)
	defer cancelWait()
	if err := chromedp.Do(wctx, chromedp.Navigate(ops.URL+"/")); err != nil {
		t.Fatal(err)
	}
	const read = `({lanes: document.querySelectorAll("section.lane").length, updated: document.getElementById("conn").textContent})`
	type page struct {
		Lanes   int    `json:"lanes"`
		Updated string `json:"updated"`
	}
	var got page
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(250 * time.Millisecond) {
		if got, err = chromedp.Run(wctx, chromedp.Evaluate[page](read)); err != nil {
			t.Fatal(err)
		}
		if got.Lanes == len(names) && strings.HasPrefix(got.Updated, "updated ") {
			break
		}
	}
	if got.Lanes != len(names) || !strings.HasPrefix(got.Updated, "updated ") {
		t.Errorf("%d lanes drawn, the page's clock %q; want %d lanes, updating", got.Lanes, got.Updated, len(names))
	}
	mu.Lock()
	defer mu.Unlock()
	if len(exceptions) > 0 {
		t.Errorf("the page threw: %q", exceptions)
	}
}
