// Package scale measures what a fleet of sluiceredis Backends costs Redis:
// round trips and script runs a second per process, and Redis's CPU, for
// processes on one key and for processes with many keys, busy or idle. The
// processes are Backends of one program, each with its own client, as a
// separate process would have; their lanes are stand-ins that state a
// fixed demand (see sluice.Leaser), so that what is measured is the
// Backends' work and not HTTP's.
package scale

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/sluiceredis"
)

// A Config is one measurement.
type Config struct {
	Addr    string        // Redis's address
	Procs   int           // processes (Backends)
	Keys    int           // keys per process
	Busy    int           // of them, how many want more than the rate (the others want nothing)
	Shared  bool          // every process uses the same keys (else each its own)
	Refresh time.Duration // sluiceredis.WithRefresh; 0: the default
	Warm    time.Duration // before measuring: idle keys are parked by then
	Run     time.Duration // measured
	Wakes   int           // idle keys woken after the run, one at a time, to time their first share
}

// A Result is what a measurement found.
type Result struct {
	Calls   float64       // round trips a second, per process (a pipeline is one)
	Scripts float64       // script runs a second, per process
	CPU     float64       // Redis's CPU over the run, in cores
	Wake    time.Duration // the longest an idle key's lane waited for a share (Wakes > 0)
}

// counter counts a client's round trips.
type counter struct{ n atomic.Int64 }

func (c *counter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (c *counter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { c.n.Add(1); return next(ctx, cmd) }
}
func (c *counter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error { c.n.Add(1); return next(ctx, cmds) }
}

// lane is a stand-in lane: it wants what want says, and keeps its grants.
type lane struct {
	mu    sync.Mutex
	want  int // Batch requests waiting
	share sluice.Share
	at    time.Time // of the latest share with a rate
}

func (l *lane) demand() (sluice.Demand, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	d := sluice.Demand{Rate: 100, Burst: 4}
	d.Waiting[sluice.Batch] = l.want
	return d, true
}

func (l *lane) grant(s sluice.Share) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.share = s
	if s.Rate > 0 {
		l.at = time.Now()
	}
}

// Measure runs cfg.
func Measure(ctx context.Context, cfg Config) (Result, error) {
	admin := redis.NewClient(&redis.Options{Addr: cfg.Addr, ContextTimeoutEnabled: true})
	defer admin.Close()
	if err := admin.FlushAll(ctx).Err(); err != nil {
		return Result{}, err
	}
	var opts []sluiceredis.Option
	if cfg.Refresh > 0 {
		opts = append(opts, sluiceredis.WithRefresh(cfg.Refresh))
	}
	counters := make([]*counter, cfg.Procs)
	var idle []*lane
	for p := range cfg.Procs {
		c := redis.NewClient(&redis.Options{Addr: cfg.Addr, ContextTimeoutEnabled: true, PoolSize: 32})
		defer c.Close()
		counters[p] = new(counter)
		c.AddHook(counters[p])
		b, err := sluiceredis.New(c, opts...)
		if err != nil {
			return Result{}, err
		}
		defer b.Close()
		for k := range cfg.Keys {
			key := "k" + strconv.Itoa(k)
			if !cfg.Shared {
				key = "p" + strconv.Itoa(p) + ":" + key
			}
			l := &lane{want: 1}
			if k < cfg.Busy {
				l.want = 100
			}
			if !b.Join(key, l.demand, l.grant) {
				return Result{}, fmt.Errorf("scale: Join declined")
			}
			if k >= cfg.Busy {
				// Idle from its first refresh on.
				l.mu.Lock()
				l.want = 0
				l.mu.Unlock()
				idle = append(idle, l)
			}
		}
	}
	sleep := func(d time.Duration) error {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(d):
			return nil
		}
	}
	if err := sleep(cfg.Warm); err != nil {
		return Result{}, err
	}
	calls0 := sum(counters)
	scripts0, cpu0, err := redisCounts(ctx, admin)
	if err != nil {
		return Result{}, err
	}
	t0 := time.Now()
	if err := sleep(cfg.Run); err != nil {
		return Result{}, err
	}
	secs := time.Since(t0).Seconds()
	calls1 := sum(counters)
	scripts1, cpu1, err := redisCounts(ctx, admin)
	if err != nil {
		return Result{}, err
	}
	r := Result{
		Calls:   float64(calls1-calls0) / secs / float64(cfg.Procs),
		Scripts: float64(scripts1-scripts0) / secs / float64(cfg.Procs),
		CPU:     (cpu1 - cpu0) / secs,
	}
	for i := range min(cfg.Wakes, len(idle)) {
		l := idle[i*len(idle)/cfg.Wakes]
		asked := time.Now()
		l.mu.Lock()
		l.want = 1
		l.mu.Unlock()
		for {
			l.mu.Lock()
			got := l.at.After(asked)
			l.mu.Unlock()
			if got {
				break
			}
			if time.Since(asked) > 10*time.Second {
				return r, fmt.Errorf("scale: an idle key got no share within 10s of a request")
			}
			if err := sleep(time.Millisecond); err != nil {
				return r, err
			}
		}
		r.Wake = max(r.Wake, time.Since(asked))
	}
	return r, nil
}

func sum(cs []*counter) int64 {
	var n int64
	for _, c := range cs {
		n += c.n.Load()
	}
	return n
}

// redisCounts returns the scripts Redis has run and the CPU it has used,
// in seconds.
func redisCounts(ctx context.Context, c *redis.Client) (scripts int64, cpu float64, err error) {
	info, err := c.Info(ctx, "commandstats", "cpu").Result()
	if err != nil {
		return 0, 0, err
	}
	for _, line := range strings.Split(info, "\n") {
		line = strings.TrimSpace(line)
		name, rest, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		switch name {
		case "cmdstat_evalsha", "cmdstat_eval":
			for _, f := range strings.Split(rest, ",") {
				if v, ok := strings.CutPrefix(f, "calls="); ok {
					n, _ := strconv.ParseInt(v, 10, 64)
					scripts += n
				}
			}
		case "used_cpu_sys", "used_cpu_user":
			f, _ := strconv.ParseFloat(rest, 64)
			cpu += f
		}
	}
	return scripts, cpu, nil
}
