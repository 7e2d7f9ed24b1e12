// Command scale prints what a fleet of sluiceredis Backends costs Redis:
// round trips and script runs a second per process, and Redis's CPU, for
// 64 processes on one key and for a process with 10,000 keys, busy (each
// wanting more than its rate) or idle (wanting nothing).
//
//	cd sluiceredis && go run ./cmd/scale
//
// The processes are Backends of this program, each with its own Redis
// client, as separate processes would have; their lanes are stand-ins
// that state a fixed demand, so that what is measured is the Backends'
// work (see internal/scale). It starts a redis-server of its own on a
// free port (apt-get install redis-server), or uses -redis ADDR.
//
// Flags:
//
//	-redis ADDR   an existing Redis (host:port); it is flushed
//	-warm 5s      before measuring (idle keys are parked by then)
//	-run 10s      measured, per row
//	-wakes 5      idle keys woken after each row with idle keys, to time
//	              how long a request to one waits for its share
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"runtime"
	"time"

	"github.com/sluice-go/sluice/sluiceredis"
	"github.com/sluice-go/sluice/sluiceredis/internal/redistest"
	"github.com/sluice-go/sluice/sluiceredis/internal/scale"
)

func main() {
	addr := flag.String("redis", "", "an existing Redis (host:port); it is flushed")
	warm := flag.Duration("warm", 5*time.Second, "before measuring")
	run := flag.Duration("run", 10*time.Second, "measured, per row")
	wakes := flag.Int("wakes", 5, "idle keys woken after each row with idle keys")
	flag.Parse()
	if *addr == "" {
		srv, err := redistest.StartServer()
		if err != nil {
			fmt.Fprintln(os.Stderr, "scale:", err)
			os.Exit(1)
		}
		defer srv.Stop()
		*addr = srv.Addr()
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()

	rows := []struct {
		name string
		cfg  scale.Config
	}{
		{"64 processes, one key, each wanting more than the rate", scale.Config{Procs: 64, Keys: 1, Busy: 1, Shared: true}},
		{"64 processes, one key, idle", scale.Config{Procs: 64, Keys: 1, Shared: true}},
		{"one process, 10,000 keys, idle", scale.Config{Procs: 1, Keys: 10000}},
		{"one process, 10,000 keys, 100 of them busy", scale.Config{Procs: 1, Keys: 10000, Busy: 100}},
		{"one process, 10,000 keys, all busy", scale.Config{Procs: 1, Keys: 10000, Busy: 10000}},
	}
	fmt.Printf("Redis at %s, refresh %v, %d CPUs; each row measured over %v after %v\n\n", *addr, sluiceredis.DefaultRefresh, runtime.NumCPU(), *run, *warm)
	fmt.Println("| fleet | Redis round trips a second per process | script runs a second per process | Redis CPU (cores) | an idle key's first share |")
	fmt.Println("|---|---|---|---|---|")
	for _, r := range rows {
		cfg := r.cfg
		cfg.Addr, cfg.Warm, cfg.Run = *addr, *warm, *run
		if cfg.Busy < cfg.Keys {
			cfg.Wakes = *wakes
		}
		res, err := scale.Measure(ctx, cfg)
		if err != nil {
			fmt.Fprintln(os.Stderr, "scale:", r.name+":", err)
			os.Exit(1)
		}
		wake := "-"
		if cfg.Wakes > 0 {
			wake = "within " + res.Wake.Round(time.Millisecond).String()
		}
		fmt.Printf("| %s | %.2f | %.2f | %.3f | %s |\n", r.name, res.Calls, res.Scripts, res.CPU, wake)
	}
}
