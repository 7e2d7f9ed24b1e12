// Package trace reads the header traces that the bench records from real
// rate-limiting middleware into testdata/traces: for each request of a
// paced sequence, when it was sent and answered on the client's clock, the
// status and the response's headers. The format is described in
// bench/traces.go.
package trace

import (
	"bufio"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"
)

// A Trace is what a real rate-limiting middleware answered to a paced
// sequence of requests.
type Trace struct {
	Setup   string        // how the middleware was set up
	Limit   int           // the published allowance: Limit per Per
	Per     time.Duration //
	Start   time.Time     // the client's clock when the sequence began
	Records []Record
}

// A Record is one response of a trace.
type Record struct {
	Sent, Received time.Duration // after Start, on the client's clock
	Status         int
	Header         http.Header
}

// Read parses the trace file at path.
func Read(path string) (*Trace, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	tr := &Trace{}
	var cur *Record
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		fail := func(what string) error { return fmt.Errorf("%s:%d: %s: %q", path, n, what, line) }
		switch {
		case strings.HasPrefix(line, "#"):
		case line == "":
			cur = nil
		case strings.HasPrefix(line, "@"):
			key, val, _ := strings.Cut(line[1:], " ")
			switch key {
			case "setup":
				tr.Setup = val
			case "published":
				l, p, ok := strings.Cut(val, "/")
				if tr.Limit, err = strconv.Atoi(l); !ok || err != nil {
					return nil, fail("bad @published")
				}
				if tr.Per, err = time.ParseDuration(p); err != nil {
					return nil, fail("bad @published")
				}
			case "start":
				if tr.Start, err = time.Parse(time.RFC3339Nano, val); err != nil {
					return nil, fail("bad @start")
				}
			default:
				return nil, fail("unknown directive")
			}
		case cur == nil:
			f := strings.Fields(line)
			if len(f) != 3 {
				return nil, fail("want <sent> <received> <status>")
			}
			var r Record
			sent, err1 := strconv.ParseFloat(f[0], 64)
			received, err2 := strconv.ParseFloat(f[1], 64)
			status, err3 := strconv.Atoi(f[2])
			if err1 != nil || err2 != nil || err3 != nil || received < sent {
				return nil, fail("bad record line")
			}
			r.Sent = time.Duration(sent * float64(time.Second))
			r.Received = time.Duration(received * float64(time.Second))
			r.Status, r.Header = status, http.Header{}
			tr.Records = append(tr.Records, r)
			cur = &tr.Records[len(tr.Records)-1]
		default:
			k, v, ok := strings.Cut(line, ": ")
			if !ok || k != http.CanonicalHeaderKey(k) {
				return nil, fail("want a canonical \"Name: value\"")
			}
			cur.Header[k] = append(cur.Header[k], v)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if tr.Limit <= 0 || tr.Per <= 0 || tr.Start.IsZero() || len(tr.Records) == 0 {
		return nil, fmt.Errorf("%s: no @published, @start or records", path)
	}
	return tr, nil
}
