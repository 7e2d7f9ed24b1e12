package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/sluice-go/sluice/internal/upstream"
)

// The server model runs in a child process, as a real API does in its own.
// In one process, the clients' garbage collections (several a second at
// these allocation rates) delayed the server's clock reads by up to a few
// milliseconds, and a strict (burst 1) limiter took requests sent 20 ms
// apart for requests 17 ms apart: the instrument refused what the client
// had paced right. docs/design.md, "The bench's server process", says why.
const (
	serveEnv   = "SLUICE_BENCH_SERVE"   // in the child: the model to serve, by name
	latencyEnv = "SLUICE_BENCH_LATENCY" // in the child: the service latency
)

// serveIfChild serves the model that serveEnv names and exits, when this
// process is a bench server started by startRemote; otherwise it returns.
// The child prints its API and control URLs on one line, and exits when
// its standard input ends, so it never outlives the bench.
func serveIfChild() {
	name := os.Getenv(serveEnv)
	if name == "" {
		return
	}
	if err := serve(name, os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "bench server:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

func serve(name string, in io.Reader, out io.Writer) error {
	m, err := modelNamed(name)
	if err != nil {
		return err
	}
	latency, err := time.ParseDuration(os.Getenv(latencyEnv))
	if err != nil {
		return fmt.Errorf("%s: %w", latencyEnv, err)
	}
	if m.mw != nil {
		return serveMiddleware(m, latency, in, out)
	}
	lim := m.make()
	srv := upstream.NewTCP(upstream.Config{
		Limiter: lim,
		Latency: func(int, *http.Request) time.Duration { return latency },
	})
	defer srv.Close()
	ctl := httptest.NewServer(controlMux(srv, lim))
	defer ctl.Close()
	if _, err := fmt.Fprintf(out, "%s %s\n", srv.URL(), ctl.URL); err != nil {
		return err
	}
	_, err = io.Copy(io.Discard, in) // until the parent closes it, or dies
	return err
}

// arrival is what the parent needs of an upstream.Arrival.
type arrival struct {
	At       time.Time
	Accepted bool
}

// The child states times on its monotonic clock, as offsets from origin,
// never as wall-clock instants: a wall clock stepped during a run (as a
// virtual machine's may be) would move every arrival out of the span
// measured. The parent maps them onto its own clock (see remote.sync).
var origin = time.Now()

// wireArrival is an arrival as the child sends it.
type wireArrival struct {
	Since    time.Duration // after origin
	Accepted bool
}

// handleClock serves the control endpoints every child has: its arrivals
// as the parent asks for them, and its clock.
func handleClock(mux *http.ServeMux, arrivals func() []wireArrival) {
	mux.HandleFunc("GET /arrivals", func(w http.ResponseWriter, _ *http.Request) {
		json.NewEncoder(w).Encode(arrivals())
	})
	mux.HandleFunc("GET /now", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprint(w, int64(time.Since(origin)))
	})
}

func controlMux(srv *upstream.Server, lim upstream.Model) *http.ServeMux {
	mux := http.NewServeMux()
	handleClock(mux, func() []wireArrival {
		as := srv.Arrivals()
		out := make([]wireArrival, len(as))
		for i, a := range as {
			out[i] = wireArrival{Since: a.At.Sub(origin), Accepted: a.Accepted}
		}
		return out
	})
	gh, _ := lim.(*upstream.GitHub)
	mux.HandleFunc("POST /trigger", func(w http.ResponseWriter, r *http.Request) {
		d, err := time.ParseDuration(r.FormValue("d"))
		if gh == nil || err != nil {
			http.Error(w, "no GitHub model, or a bad duration", http.StatusBadRequest)
			return
		}
		gh.Trigger(d)
	})
	mux.HandleFunc("GET /penalty", func(w http.ResponseWriter, _ *http.Request) {
		if gh == nil {
			http.Error(w, "no GitHub model", http.StatusBadRequest)
			return
		}
		fmt.Fprint(w, gh.PenaltyArrivals())
	})
	return mux
}

func modelNamed(name string) (model, error) {
	for _, m := range models() {
		if m.name == name {
			return m, nil
		}
	}
	return model{}, fmt.Errorf("no model %q", name)
}

// remote is a bench server in a child process.
type remote struct {
	cmd      *exec.Cmd
	stdin    io.WriteCloser
	url, ctl string
	tr       *http.Transport // to url, with connections enough for every caller
	ctlc     *http.Client
	// at is the parent's time when the child's clock read since: an
	// arrival since+x after the child's origin came at at+x-since.
	at    time.Time
	since time.Duration
}

// startRemote starts a child process serving m with the given latency.
func startRemote(m model, latency time.Duration) (*remote, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), serveEnv+"="+m.name, latencyEnv+"="+latency.String())
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	r := &remote{cmd: cmd, stdin: stdin}
	line, err := bufio.NewReader(stdout).ReadString('\n')
	urls := strings.Fields(line)
	if err != nil || len(urls) != 2 {
		r.close()
		return nil, fmt.Errorf("bench server for %q: read %q: %v", m.name, line, err)
	}
	r.url, r.ctl = urls[0], urls[1]
	r.tr = &http.Transport{
		DialContext:         (&net.Dialer{}).DialContext,
		MaxIdleConns:        256,
		MaxIdleConnsPerHost: 256,
	}
	r.ctlc = &http.Client{Timeout: 30 * time.Second}
	if err := r.sync(); err != nil {
		r.close()
		return nil, err
	}
	return r, nil
}

// sync reads the child's clock, and notes the parent's time at the middle
// of the read (a loopback round trip: a fraction of a millisecond off).
func (r *remote) sync() error {
	t0 := time.Now()
	resp, err := r.ctlc.Get(r.ctl + "/now")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	var since int64
	if _, err := fmt.Fscan(resp.Body, &since); err != nil {
		return fmt.Errorf("bench server clock: %w", err)
	}
	r.at, r.since = t0.Add(time.Since(t0)/2), time.Duration(since)
	return nil
}

func (r *remote) arrivals() ([]arrival, error) {
	resp, err := r.ctlc.Get(r.ctl + "/arrivals")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var ws []wireArrival
	if err := json.NewDecoder(resp.Body).Decode(&ws); err != nil {
		return nil, fmt.Errorf("bench server arrivals: %w", err)
	}
	as := make([]arrival, len(ws))
	for i, w := range ws {
		as[i] = arrival{At: r.at.Add(w.Since - r.since), Accepted: w.Accepted}
	}
	return as, nil
}

func (r *remote) trigger(d time.Duration) error {
	resp, err := r.ctlc.Post(r.ctl+"/trigger?d="+d.String(), "", nil)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("bench server trigger: %s", resp.Status)
	}
	return nil
}

func (r *remote) penaltyArrivals() (int, error) {
	resp, err := r.ctlc.Get(r.ctl + "/penalty")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var n int
	if _, err := fmt.Fscan(resp.Body, &n); err != nil || resp.StatusCode != http.StatusOK {
		return 0, errors.Join(fmt.Errorf("bench server penalty: %s", resp.Status), err)
	}
	return n, nil
}

// close ends the child and waits for it.
func (r *remote) close() {
	if r.tr != nil {
		r.tr.CloseIdleConnections()
	}
	r.stdin.Close()
	done := make(chan struct{})
	go func() {
		r.cmd.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		r.cmd.Process.Kill()
		<-done
	}
}

// serveMiddleware serves a model of real middleware as serve does: the
// middleware around a handler that answers after latency, behind a
// recorder of every arrival and whether it was served (status 200).
func serveMiddleware(m model, latency time.Duration, in io.Reader, out io.Writer) error {
	var addr string
	if m.redis {
		rs, err := startRedis()
		if err != nil {
			return err
		}
		defer rs.stop()
		addr = rs.addr
	}
	inner := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t := time.NewTimer(latency)
		defer t.Stop()
		select {
		case <-t.C:
			io.WriteString(w, "ok")
		case <-r.Context().Done():
		}
	})
	h, stop, err := m.mw(inner, addr)
	if err != nil {
		return err
	}
	defer stop()
	rec := &recorder{next: h}
	srv := httptest.NewServer(rec)
	defer srv.Close()
	mux := http.NewServeMux()
	handleClock(mux, rec.arrivals)
	ctl := httptest.NewServer(mux)
	defer ctl.Close()
	if _, err := fmt.Fprintf(out, "%s %s\n", srv.URL, ctl.URL); err != nil {
		return err
	}
	_, err = io.Copy(io.Discard, in) // until the parent closes it, or dies
	return err
}

// recorder notes when each request arrived and whether the handler it
// wraps served it. It is safe for concurrent use.
type recorder struct {
	next http.Handler
	mu   sync.Mutex
	as   []wireArrival
}

func (rec *recorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	at := time.Since(origin)
	sw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
	rec.next.ServeHTTP(sw, r)
	rec.mu.Lock()
	rec.as = append(rec.as, wireArrival{Since: at, Accepted: sw.status == http.StatusOK})
	rec.mu.Unlock()
}

func (rec *recorder) arrivals() []wireArrival {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	return slices.Clone(rec.as)
}

// statusWriter remembers the status a handler wrote.
type statusWriter struct {
	http.ResponseWriter
	status int
	wrote  bool
}

func (w *statusWriter) WriteHeader(code int) {
	if !w.wrote {
		w.status, w.wrote = code, true
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(p []byte) (int, error) {
	w.wrote = true
	return w.ResponseWriter.Write(p)
}
