package sluiceredis

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-go/sluice"
)

// ErrClosed is wrapped by the errors Take and Cool return after Close.
var ErrClosed = errors.New("sluiceredis: backend closed")

// maxOrphans bounds the orphans one budget remembers; older ones are left
// to expire with their ttl. An outage adds about one a probe interval (only
// the probing call goes to Redis), so the bound is reached only after hours
// of a Redis that fails every call without being marked down.
const maxOrphans = 4 * maxRelease

// orphan records that the call that asked for lease id failed or timed out,
// so that nobody knows whether it took the lease: it may run in Redis
// later (a stalled server runs what it had received when it resumes). A
// goroutine gives such leases back, and cancels the calls still to run,
// once Redis answers (see releaseOrphans). bg.mu must not be held.
func (b *backend) orphan(bg *budget, id string) {
	bg.mu.Lock()
	bg.orphans = append(bg.orphans, id)
	if n := len(bg.orphans) - maxOrphans; n > 0 {
		bg.orphans = slices.Delete(bg.orphans, 0, n)
	}
	bg.mu.Unlock()
	b.keepReleasing()
}

// keepReleasing makes sure that a goroutine gives back orphans while there
// are any. mu and no budget's mu may be held.
func (b *backend) keepReleasing() {
	b.mu.Lock()
	if !b.releasing && !b.closed.Load() {
		b.releasing = true
		b.wg.Add(1)
		go b.releaseOrphans()
	}
	b.mu.Unlock()
}

// releaseOrphans gives back the orphans of every budget, one Redis call per
// budget (per maxRelease orphans), and returns once there are none or at
// Close. While Redis is unreachable it waits until a call finds it back, or
// takes its turn at probing it once per probe interval: it never adds to
// the calls a down Redis receives, and never makes a caller wait.
func (b *backend) releaseOrphans() {
	defer b.wg.Done()
	t := time.NewTimer(b.cfg.probeEvery)
	defer t.Stop()
	for {
		work := b.orphaned()
		if work == nil {
			return
		}
		if b.releaseAll(work) {
			continue
		}
		t.Reset(b.cfg.probeEvery)
		select {
		case <-b.done:
			return
		case <-b.back:
		case <-t.C:
		}
	}
}

// orphaned returns the budgets with orphans. When there are none it marks
// the releaser stopped, under mu: an orphan recorded after that finds it
// stopped and starts another (see keepReleasing).
func (b *backend) orphaned() []*budget {
	b.mu.Lock()
	defer b.mu.Unlock()
	var work []*budget
	for _, bg := range b.budgets {
		bg.mu.Lock()
		if len(bg.orphans) > 0 {
			work = append(work, bg)
		}
		bg.mu.Unlock()
	}
	if len(work) == 0 || b.closed.Load() {
		b.releasing = false
		return nil
	}
	return work
}

// releaseAll gives back up to maxRelease orphans of each budget in work.
// It returns false if Redis could not be asked for one of them, or did not
// answer.
func (b *backend) releaseAll(work []*budget) bool {
	all := true
	for _, bg := range work {
		if !bg.health.up() && !bg.health.use(time.Now()) {
			all = false
			continue
		}
		bg.mu.Lock()
		n := min(len(bg.orphans), maxRelease)
		ids := slices.Clone(bg.orphans[:n])
		bg.orphans = slices.Delete(bg.orphans, 0, n)
		bg.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), b.cfg.timeout)
		err := runRelease(ctx, b.client, bg.keys, b.cfg.leaseTTL, ids)
		cancel()
		now := time.Now()
		if err != nil && unreachable(err) {
			bg.mu.Lock()
			bg.orphans = append(ids, bg.orphans...)
			bg.mu.Unlock()
			b.failed(bg, now, err)
			all = false
			continue
		}
		// An error reply (a key of the budget holds another type) would
		// come again: those leases are left to expire with their ttl.
		b.recovered(bg, now)
	}
	return all
}

// releaseNow gives back ids, leases of bg this process holds or may hold,
// with one call per maxRelease bounded by the timeout, and cancels those
// whose call is still to run. It returns how many it could not give back,
// and why.
func (b *backend) releaseNow(bg *budget, ids []string) (int, error) {
	for len(ids) > 0 {
		n := min(len(ids), maxRelease)
		ctx, cancel := context.WithTimeout(context.Background(), b.cfg.timeout)
		err := runRelease(ctx, b.client, bg.keys, b.cfg.leaseTTL, ids[:n])
		cancel()
		if err != nil {
			return len(ids), err
		}
		ids = ids[n:]
	}
	return 0, nil
}

// shutdown serves Close: once, and later calls return what it returned.
func (b *backend) shutdown() error {
	b.closeOnce.Do(func() { b.closeErr = b.close() })
	return b.closeErr
}

// enter registers a call of Take, Done or Cool, which Close waits for. It
// returns false once Close has begun: the call must then do nothing.
func (b *backend) enter() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed.Load() {
		return false
	}
	b.calls++
	return true
}

// leave ends a call registered by enter.
func (b *backend) leave() {
	b.mu.Lock()
	b.calls--
	if b.calls == 0 && b.drained != nil {
		close(b.drained)
		b.drained = nil
	}
	b.mu.Unlock()
}

func (b *backend) close() error {
	b.mu.Lock()
	b.closed.Store(true)
	close(b.done)
	var drained chan struct{}
	if b.calls > 0 {
		drained = make(chan struct{})
		b.drained = drained
	}
	b.mu.Unlock()
	b.wakers.close()
	// The calls under way each end within a timeout, and may leave leases
	// to give back (a reply, a release to retry, an orphan): wait for them,
	// and for the goroutines, before collecting what is held.
	if drained != nil {
		<-drained
	}
	b.wg.Wait()
	b.mu.Lock()
	b.renewing, b.releasing = false, false
	// Collected after the calls under way: one of them may have made a
	// budget (a key this process had not used), and taken a lease in it.
	budgets := slices.Collect(maps.Values(b.budgets))
	b.mu.Unlock()
	b.closeShares()

	if b.cfg.leases == 0 {
		return nil
	}
	var (
		left  int
		first error
	)
	for _, bg := range budgets {
		bg.mu.Lock()
		ids := append(append(bg.leases(), bg.release...), bg.orphans...)
		bg.held, bg.local, bg.pending, bg.release, bg.orphans = nil, 0, nil, nil, nil
		bg.mu.Unlock()
		if len(ids) == 0 {
			continue
		}
		n, err := b.releaseNow(bg, ids)
		left += n
		if err != nil && first == nil {
			first = err
		}
	}
	if left > 0 {
		return fmt.Errorf("sluiceredis: close: %d leases not given back (they expire within the ttl, %v): %w",
			left, b.cfg.leaseTTL, first)
	}
	return nil
}

// closeShares gives back this process's shares (see Backend), so that
// the fleet has them at its next refreshes rather than at the end of the
// leases, and leaves the lanes a share of nothing: a Transport still in use
// sends nothing more through a closed Backend. The refresher has stopped.
func (b *backend) closeShares() {
	s := &b.shares
	s.mu.Lock()
	keys := slices.Collect(maps.Values(s.keys))
	s.keys, s.running = nil, false
	s.mu.Unlock()
	for _, sk := range keys {
		for _, m := range sk.lanes {
			m.grant(sluice.Share{Burst: 1, InFlight: 0})
		}
	}
	// In pipelines, a timeout each: a Redis that does not answer costs
	// Close one timeout, not one a key, and the shares it keeps end with
	// their leases.
	for chunk := range slices.Chunk(keys, closeChunk) {
		ctx, cancel := context.WithTimeout(context.Background(), b.cfg.timeout)
		_, err := b.client.Pipelined(ctx, func(p redis.Pipeliner) error {
			for _, sk := range chunk {
				p.HDel(ctx, sk.redis[0], b.self)
			}
			return nil
		})
		cancel()
		if err != nil && unreachable(err) {
			return
		}
	}
}

// closeChunk is how many shares Close gives back in one pipeline.
const closeChunk = 512
