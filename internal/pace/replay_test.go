package pace

import (
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluice-go/sluice/internal/trace"
	"github.com/sluice-go/sluice/internal/verdict"
)

// TestPacerReplaysMiddlewareTraces feeds the header traces recorded from
// real middleware (testdata/traces at the repository's root; see
// bench/traces.go) to a pacer, on the trace's own clock, as a lane would
// see them: it sends nothing while a cooldown holds it, so the records of
// attempts sent then are skipped. Each trace is a burst of the limit and
// five more, a pause, a second at twice the rate and a second at half of
// it; the pacer runs with no rate, and at the published rate. Decisions
// asserted:
//
//   - every refusal sent stops the lane, for at most a window and the
//     second a reset is rounded to, for the reason the middleware gives (a
//     Retry-After, or its quota's remaining 0 where it sends none), but
//     for those listed as loose, which name no wait;
//   - the cooldowns spare the lane at least half of the trace's refusals;
//   - a configured rate is never exceeded;
//   - at the end, after a run the server accepted whole, a paced lane keeps
//     at least the pace of that run (headers that slow a lane below what
//     the server just took would do harm);
//   - the counts in Stats are those of the refusals it saw.
func TestPacerReplaysMiddlewareTraces(t *testing.T) {
	for name, want := range map[string]struct {
		why string // the cause of a refusal's cooldown, or its start
		// loose: refusals sent that do not stop the lane. ulule/limiter
		// sends no Retry-After, and its reset, a Unix time truncated to
		// the second, has passed when the window's last attempts are
		// refused; they stop the lane for a step of the second after it.
		loose int
	}{
		"throttled.txt":     {"retry-after", 0},
		"httprate.txt":      {"retry-after", 0},
		"go-limiter.txt":    {"retry-after", 0},
		"redis_rate.txt":    {"retry-after", 0},
		"ulule-limiter.txt": {"remaining 0", 0}, // no Retry-After: its reset
		"tollbooth.txt":     {"remaining 0", 0}, // no Retry-After: its reset
	} {
		tr, err := trace.Read(filepath.Join("..", "..", "testdata", "traces", name))
		if err != nil {
			t.Fatal(err)
		}
		// The pace of the trailing run of acceptances.
		k := len(tr.Records) - 1
		for k > 0 && tr.Records[k-1].Status == http.StatusOK {
			k--
		}
		last := tr.Records[len(tr.Records)-1]
		if len(tr.Records)-k < 3 || last.Status != http.StatusOK {
			t.Fatalf("%s: no trailing run of acceptances", name)
		}
		tail := float64(len(tr.Records)-1-k) / (last.Sent - tr.Records[k].Sent).Seconds()
		published := float64(tr.Limit) / tr.Per.Seconds()

		for _, rate := range []float64{0, published} {
			p := New(rate, 1, time.Minute, true, 0)
			var refused, rawRefused, loose int
			for i, r := range tr.Records {
				if r.Status == http.StatusTooManyRequests {
					rawRefused++
				}
				if r.Sent < p.NotBefore() {
					continue // the lane would not have sent it
				}
				rep := ReadReply(&http.Response{StatusCode: r.Status, Header: r.Header}, tr.Start.Add(r.Received), time.Minute)
				rep.Sent = r.Sent
				now := r.Received
				c := p.Observe(now, rep, 1)
				p.Settle(now, r.Sent, c.Kind)
				at := func() string { return fmt.Sprintf("%s at %g/s, record %d", name, rate, i) }
				if r.Status == http.StatusTooManyRequests {
					refused++
					stop := p.NotBefore() - now
					if stop <= 0 {
						loose++
					}
					if c.Kind != verdict.Throttled || !c.Refused || stop > tr.Per+time.Second {
						t.Errorf("%s: a refusal: kind %v, refused %v, stops the lane for %v; want throttled, and a stop within %v",
							at(), c.Kind, c.Refused, stop, tr.Per+time.Second)
					}
					if c.Cool.Extended && !strings.HasPrefix(c.Cool.Why, want.why) {
						t.Errorf("%s: cooldown for %q, want %q", at(), c.Cool.Why, want.why)
					}
				} else if c.Refused {
					t.Errorf("%s: status %d read as a refusal", at(), r.Status)
				}
				if rate > 0 && p.Rate() > rate {
					t.Errorf("%s: paced at %.2f/s, over the configured %.2f/s", at(), p.Rate(), rate)
				}
			}
			if loose != want.loose {
				t.Errorf("%s at %g/s: %d refusals sent did not stop the lane, want %d", name, rate, loose, want.loose)
			}
			if 2*refused > rawRefused {
				t.Errorf("%s at %g/s: sent %d of the trace's %d refusals; the cooldowns should spare it half or more",
					name, rate, refused, rawRefused)
			}
			if r := p.Rate(); r > 0 && r < 0.95*tail {
				t.Errorf("%s at %g/s: paced at %.2f/s after the server took a run at %.2f/s whole", name, rate, r, tail)
			}
			if s := p.Stats(); s.Throttled != uint64(refused) || refused > 0 && s.Cooldowns == 0 {
				t.Errorf("%s at %g/s: stats count %d refusals and %d cooldowns; it saw %d refusals",
					name, rate, s.Throttled, s.Cooldowns, refused)
			}
		}
	}
}
