package sluiceredis

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// startChildren starts n processes of this test binary, each running the
// test named child with childEnv set to role, FLEET_PROC to its index and
// env besides. The returned wait waits for them all, failing t for any
// that failed, and returns, for each, the last line of its output that
// starts with prefix, with prefix cut ("" if none, or if prefix is "").
func startChildren(ctx context.Context, t *testing.T, n int, child, role, prefix string, env ...string) (wait func() []string) {
	var wg sync.WaitGroup
	reports := make([]string, n)
	for i := range n {
		cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^"+child+"$", "-test.v")
		cmd.SysProcAttr = childProcAttr()
		cmd.Env = append(os.Environ(), childEnv+"="+role, "FLEET_PROC="+strconv.Itoa(i))
		cmd.Env = append(cmd.Env, env...)
		wg.Go(func() {
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Errorf("process %d: %v\n%s", i, err, out)
			}
			if prefix == "" {
				return
			}
			sc := bufio.NewScanner(strings.NewReader(string(out)))
			for sc.Scan() {
				if s, ok := strings.CutPrefix(sc.Text(), prefix); ok {
					reports[i] = s
				}
			}
		})
	}
	return func() []string {
		wg.Wait()
		return reports
	}
}

// A child is what a process started by startChildren for a fleet test is
// told (see fleetEnv): its index, Redis's address, the upstream's URL, and
// when to start sending, to start measuring (zero if not told) and to stop.
type child struct {
	proc              int
	redis, url        string
	start, from, stop time.Time
}

// fleetEnv is the environment that tells a child c (see readChild).
func fleetEnv(c child) []string {
	env := []string{
		"FLEET_REDIS=" + c.redis,
		"FLEET_URL=" + c.url,
		"FLEET_START=" + strconv.FormatInt(c.start.UnixNano(), 10),
		"FLEET_STOP=" + strconv.FormatInt(c.stop.UnixNano(), 10),
	}
	if !c.from.IsZero() {
		env = append(env, "FLEET_FROM="+strconv.FormatInt(c.from.UnixNano(), 10))
	}
	return env
}

// readChild reads what startChildren and fleetEnv told this process; it
// skips t unless this process is a child in role, so that the child test
// run alone does nothing.
func readChild(t *testing.T, role string) child {
	if os.Getenv(childEnv) != role {
		t.Skip("a child process of a fleet test, run by it")
	}
	at := func(k string) time.Time {
		s, ok := os.LookupEnv(k)
		if !ok && k == "FLEET_FROM" {
			return time.Time{}
		}
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			t.Fatalf("%s: %v", k, err)
		}
		return time.Unix(0, v)
	}
	proc, err := strconv.Atoi(os.Getenv("FLEET_PROC"))
	if err != nil {
		t.Fatalf("FLEET_PROC: %v", err)
	}
	return child{proc: proc, redis: os.Getenv("FLEET_REDIS"), url: os.Getenv("FLEET_URL"),
		start: at("FLEET_START"), from: at("FLEET_FROM"), stop: at("FLEET_STOP")}
}

// A recorder is an upstream for fleet tests: it records when each request
// arrived and which process sent it (X-Proc, -1 if none), and answers
// "ok" after delay.
type recorder struct {
	url  string
	mu   sync.Mutex
	at   []time.Time
	proc []int
}

// newRecorder starts a recorder, closed when t ends.
func newRecorder(t *testing.T, delay time.Duration) *recorder {
	r := &recorder{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		now := time.Now()
		p, err := strconv.Atoi(req.Header.Get("X-Proc"))
		if err != nil {
			p = -1
		}
		r.mu.Lock()
		r.at = append(r.at, now)
		r.proc = append(r.proc, p)
		r.mu.Unlock()
		if delay > 0 {
			time.Sleep(delay)
		}
		io.WriteString(w, "ok\n")
	}))
	t.Cleanup(srv.Close)
	r.url = srv.URL
	return r
}

// arrivals returns when each request arrived so far, in arrival order,
// and which process sent it.
func (r *recorder) arrivals() (at []time.Time, proc []int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.at), slices.Clone(r.proc)
}
