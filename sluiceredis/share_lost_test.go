package sluiceredis

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sluice-go/sluice"
)

// replyDropper is a go-redis hook that, while drop is set, lets every call
// run on Redis and then loses its reply, as a reply that comes after the
// caller's timeout is lost to it; dropped counts those calls (a pipeline
// is one).
type replyDropper struct {
	drop    atomic.Bool
	dropped atomic.Int64
}

func (d *replyDropper) DialHook(next redis.DialHook) redis.DialHook { return next }

func (d *replyDropper) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if d.drop.Load() {
			d.dropped.Add(1)
			cmd.SetErr(context.DeadlineExceeded)
			return context.DeadlineExceeded
		}
		return err
	}
}

func (d *replyDropper) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		if d.drop.Load() {
			d.dropped.Add(1)
			for _, cmd := range cmds {
				cmd.SetErr(context.DeadlineExceeded)
			}
			return context.DeadlineExceeded
		}
		return err
	}
}

// TestSharesRepliesLost: process a's calls run on Redis, but their replies
// are lost, one after another, while process b's demand moves from Batch
// to Interactive, which wants the whole rate. a sends at the share it
// holds, then at its fallback; its calls after a lost reply record that
// share in its entry, so b is granted only what a leaves, and the two
// never hold more than the rate. Once a's replies come again, a gives its
// share up and b is granted the rate.
func TestSharesRepliesLost(t *testing.T) {
	const refresh = 100 * time.Millisecond
	srv := startRedis(t)
	ca := newClient(t, srv.Addr())
	lost := new(replyDropper)
	ca.AddHook(lost)
	a := newBackend(t, ca, WithRefresh(refresh))
	b := newBackend(t, newClient(t, srv.Addr()), WithRefresh(refresh))
	defer a.Close()
	defer b.Close()
	la, lb := joinLane(t, a, "api", batch100), joinLane(t, b, "api", batch100)
	waitShare(t, la, 50, "a")
	waitShare(t, lb, 50, "b")

	lost.drop.Store(true)
	for lost.dropped.Load() < 2 {
		time.Sleep(5 * time.Millisecond)
	}
	lb.mu.Lock()
	lb.d = sluice.Demand{Rate: 100, Burst: 4, Waiting: [3]int{100, 0, 0}}
	lb.mu.Unlock()
	moved := time.Now()
	var worst float64
	var when time.Duration
	for time.Since(moved) < shareLeases*refresh+time.Second {
		if s := la.last().s.Rate + lb.last().s.Rate; s > worst {
			worst, when = s, time.Since(moved)
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Logf("a's replies lost: a holds %.1f/s, b %.1f/s; together at most %.1f/s", la.last().s.Rate, lb.last().s.Rate, worst)
	if worst > 100*1.01 {
		t.Errorf("a and b held %.1f/s together %v after b's demand moved, with a's replies lost; the rate is 100/s", worst, when.Round(time.Millisecond))
	}
	lost.drop.Store(false)
	waitShare(t, lb, 100, "b, once a's replies come again")
	if s := la.last().s.Rate; s > 1 {
		t.Errorf("a holds %.1f/s once its replies come again, beside b's 100/s", s)
	}
}
