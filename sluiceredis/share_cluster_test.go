package sluiceredis

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"math"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-go/sluice/sluiceredis/internal/redistest"
)

// startCluster starts a Redis Cluster of n masters (redis-server
// --cluster-enabled yes), each with an even range of the slots, and waits
// until every node says the cluster is ok. Without full coverage required,
// the masters left serve their own slots when one dies, as a cluster
// configured for availability does.
func startCluster(t *testing.T, n int) []*redistest.Server {
	masters, _ := startClusterReplicas(t, n, false)
	return masters
}

// startClusterReplicas is startCluster with, if replicas is set, a replica
// of each master, and a node timeout of half a second: a master that dies
// is failed over to its replica within a few seconds.
func startClusterReplicas(t *testing.T, n int, replicas bool) (masters, reps []*redistest.Server) {
	t.Helper()
	redistest.Require(t)
	dir := t.TempDir()
	total := n
	if replicas {
		total = 2 * n
	}
	nodes := make([]*redistest.Server, total)
	for i := range nodes {
		s, err := redistest.StartServerArgs("--cluster-enabled", "yes",
			"--cluster-config-file", fmt.Sprintf("%s/nodes-%d.conf", dir, i),
			"--cluster-require-full-coverage", "no", "--cluster-node-timeout", "500",
			"--repl-diskless-sync-delay", "0", "--dir", dir)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(s.Stop)
		nodes[i] = s
	}
	ctx := context.Background()
	c0 := redis.NewClient(&redis.Options{Addr: nodes[0].Addr()})
	defer c0.Close()
	for i, s := range nodes {
		if i < n {
			c := redis.NewClient(&redis.Options{Addr: s.Addr()})
			lo, hi := i*16384/n, (i+1)*16384/n-1
			err := c.Do(ctx, "CLUSTER", "ADDSLOTSRANGE", lo, hi).Err()
			c.Close()
			if err != nil {
				t.Fatal(err)
			}
		}
		if i > 0 {
			host, port, _ := strings.Cut(s.Addr(), ":")
			if err := c0.ClusterMeet(ctx, host, port).Err(); err != nil {
				t.Fatal(err)
			}
		}
	}
	waitCluster(t, nodes, total)
	for i := n; i < total; i++ {
		m := redis.NewClient(&redis.Options{Addr: nodes[i-n].Addr()})
		id, err := m.Do(ctx, "CLUSTER", "MYID").Text()
		m.Close()
		if err != nil {
			t.Fatal(err)
		}
		r := redis.NewClient(&redis.Options{Addr: nodes[i].Addr()})
		// The replica may not know the master's id yet: gossip spreads it.
		for deadline := time.Now().Add(20 * time.Second); ; {
			err = r.Do(ctx, "CLUSTER", "REPLICATE", id).Err()
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("CLUSTER REPLICATE on %s: %v", nodes[i].Addr(), err)
			}
			time.Sleep(50 * time.Millisecond)
		}
		// A replica that never synced cannot take over.
		for deadline := time.Now().Add(20 * time.Second); ; {
			info, _ := r.Info(ctx, "replication").Result()
			if strings.Contains(info, "master_link_status:up") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the replica on %s did not sync in 20s: %s", nodes[i].Addr(), info)
			}
			time.Sleep(20 * time.Millisecond)
		}
		r.Close()
	}
	waitCluster(t, nodes, total)
	return nodes[:n], nodes[n:]
}

// waitCluster waits until every node says the cluster is ok with known
// nodes.
func waitCluster(t *testing.T, nodes []*redistest.Server, known int) {
	t.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(20 * time.Second)
	for _, s := range nodes {
		c := redis.NewClient(&redis.Options{Addr: s.Addr()})
		for {
			info, _ := c.ClusterInfo(ctx).Result()
			if strings.Contains(info, "cluster_state:ok") && strings.Contains(info, fmt.Sprintf("cluster_known_nodes:%d", known)) {
				break
			}
			if time.Now().After(deadline) {
				c.Close()
				t.Fatalf("cluster not ok in 20s: %s", info)
			}
			time.Sleep(50 * time.Millisecond)
		}
		c.Close()
	}
}

// keysOnMasters returns a key (for newKeys) on each of n masters that
// split the slots evenly.
func keysOnMasters(t *testing.T, c *redis.ClusterClient, n int) map[int]string {
	t.Helper()
	onNode := map[int]string{}
	for k := 0; len(onNode) < n; k++ {
		key := fmt.Sprintf("api-%d", k)
		slot, err := c.ClusterKeySlot(context.Background(), newKeys(DefaultPrefix, key).shares()).Result()
		if err != nil {
			t.Fatal(err)
		}
		if node := int(slot) * n / 16384; onNode[node] == "" {
			onNode[node] = key
		}
	}
	return onNode
}

// TestSharesClusterNodeDown: on a 3-master Redis Cluster, keys whose slots
// are on different masters are shared by priority; when one master dies,
// only its keys fall back (after their leases), and the keys on the others
// keep their leased shares.
func TestSharesClusterNodeDown(t *testing.T) {
	const refresh = 100 * time.Millisecond
	nodes := startCluster(t, 3)
	addrs := make([]string, len(nodes))
	for i, s := range nodes {
		addrs[i] = s.Addr()
	}
	newCluster := func() *redis.ClusterClient {
		c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, ContextTimeoutEnabled: true, MaxRetries: -1, MaxRedirects: 1})
		t.Cleanup(func() { c.Close() })
		return c
	}
	// A key on each master: the master of a key's slot is the node whose
	// range holds it.
	onNode := keysOnMasters(t, newCluster(), 3)
	opts := []Option{WithRefresh(refresh), WithTimeout(DefaultTimeout)}
	a, err := New(newCluster(), opts...)
	if err != nil {
		t.Fatal(err)
	}
	b, err := New(newCluster(), opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	defer b.Close()
	la, lb := map[int]*shareLane{}, map[int]*shareLane{}
	for node, key := range onNode {
		la[node] = joinLane(t, a, key, interactive8)
		lb[node] = joinLane(t, b, key, batch100)
	}
	for node := range onNode {
		waitShare(t, la[node], 40, "interactive on master "+fmt.Sprint(node))
		waitShare(t, lb[node], 60, "batch on master "+fmt.Sprint(node))
	}
	down := time.Now()
	nodes[0].Stop()
	time.Sleep(1500 * time.Millisecond)
	for node := range onNode {
		for _, l := range []*shareLane{la[node], lb[node]} {
			for _, g := range l.since(down) {
				fallback := g.s.Rate >= 0.95*50-1e-9 && g.s.Rate <= 50
				switch {
				case node == 0 && !fallback && g.at.Sub(down) > shareLeases*refresh:
					t.Errorf("a key on the dead master: share %v %v after, want the fallback's 47.5-50", g.s.Rate, g.at.Sub(down))
				case node != 0 && math.Abs(g.s.Rate-40) > 1 && math.Abs(g.s.Rate-60) > 1:
					t.Errorf("a key on a live master (%d): share %v %v after master 0 died, want its leased 40 or 60", node, g.s.Rate, g.at.Sub(down))
				}
			}
		}
		last := la[node].last()
		t.Logf("master %d (%s): interactive share %.1f/s, 1.5s after master 0 died", node, onNode[node], last.s.Rate)
	}
	if g := la[0].since(down); len(g) == 0 || math.Abs(g[len(g)-1].s.Rate-40) <= 1 {
		t.Error("the key on the dead master kept its leased share past its lease")
	}
}

// TestClusterFailover: a 3-master Redis Cluster with a replica each; one
// master is killed (SIGKILL) and its replica takes its slots over. For a
// Backend and for Tokens alike, the keys on the live masters keep their
// shared rate throughout; the key on the dead master falls back locally,
// within its share (a Backend only if the outage outlasts its lease), and
// is served by Redis again within one refresh (one probe, for Tokens) of
// the failover; and no Take returns an error.
func TestClusterFailover(t *testing.T) {
	const (
		refresh = 500 * time.Millisecond
		rate    = 50.0
	)
	masters, reps := startClusterReplicas(t, 3, true)
	// Registered first, so run last: once the clients are closed, go-redis's
	// goroutine that probes the dead master's address every second exits
	// at its next wake-up.
	t.Cleanup(waitDialersGone)
	var addrs []string
	for _, s := range append(slices.Clone(masters), reps...) {
		addrs = append(addrs, s.Addr())
	}
	// One dial, not go-redis's five 100ms apart: a call to the dead master
	// fails at once rather than at the end of a timeout of a second, which
	// keeps a live master that is slow on a loaded runner from looking
	// dead.
	newCluster := func() *redis.ClusterClient {
		c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, ContextTimeoutEnabled: true,
			MaxRetries: -1, MaxRedirects: 1, DialerRetries: 1})
		t.Cleanup(func() { c.Close() })
		return c
	}
	onNode := keysOnMasters(t, newCluster(), 3)
	var la, lb, lt logs
	a, err := New(newCluster(), WithRefresh(refresh), WithTimeout(time.Second), WithLogger(slog.New(&la)))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := New(newCluster(), WithRefresh(refresh), WithTimeout(time.Second), WithLogger(slog.New(&lb)))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	tok, err := NewTokens(newCluster(), WithPrefix("tokens:"), WithTimeout(time.Second),
		withProbeEvery(refresh), WithLogger(slog.New(&lt)))
	if err != nil {
		t.Fatal(err)
	}
	defer tok.Close()

	// Two processes with Batch queues split each key's 100/s.
	ia, ib := map[int]*shareLane{}, map[int]*shareLane{}
	for node, key := range onNode {
		ia[node] = joinLane(t, a, key, batch100)
		ib[node] = joinLane(t, b, key, batch100)
	}
	for node := range onNode {
		waitShare(t, ia[node], 50, "process a on master "+fmt.Sprint(node))
		waitShare(t, ib[node], 50, "process b on master "+fmt.Sprint(node))
	}

	// Tokens: a taker on each key, as a lane's dispatcher takes them.
	ctx, cancel := context.WithCancel(context.Background())
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		grants  = map[int][]time.Time{}
		errs    []error
		tokenOn = map[int]string{}
	)
	for node, key := range onNode {
		tokenOn[node] = key
		wg.Go(func() {
			for ctx.Err() == nil {
				w, err := tok.Take(ctx, key, rate, 1)
				now := time.Now()
				mu.Lock()
				switch {
				case err != nil && ctx.Err() == nil:
					errs = append(errs, err)
				case err == nil && w == 0:
					grants[node] = append(grants[node], now)
				}
				mu.Unlock()
				if w > 0 {
					select {
					case <-ctx.Done():
					case <-time.After(w):
					}
				}
			}
		})
	}
	defer func() { cancel(); wg.Wait() }()

	time.Sleep(2 * time.Second) // tokens at their rate before the kill
	down := time.Now()
	masters[0].Stop()
	rc := redis.NewClient(&redis.Options{Addr: reps[0].Addr()})
	defer rc.Close()
	var over time.Time
	for deadline := down.Add(20 * time.Second); over.IsZero(); {
		if info, _ := rc.Info(context.Background(), "replication").Result(); strings.Contains(info, "role:master") {
			over = time.Now()
			break
		}
		if time.Now().After(deadline) {
			nodes, _ := rc.ClusterNodes(context.Background()).Result()
			info, _ := rc.Info(context.Background(), "replication").Result()
			t.Fatalf("the replica of the dead master was not promoted within 20s:\n%s\n%s", nodes, info)
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("master 0 killed; its replica took over %v later", over.Sub(down).Round(time.Millisecond))

	// Each is served by Redis again within a refresh (or a probe) of the
	// failover; a little more on a loaded runner, whose timers are late.
	// A Backend whose lease outlasted the outage need not fall back: then
	// its first grant after the failover came from Redis. (The grants are
	// read before the warnings, which a fallback logs before it grants.)
	recovered := func(l *logs, lane *shareLane, what string) time.Time {
		for deadline := over.Add(10 * time.Second); ; {
			for _, at := range l.times(slog.LevelInfo, onNode[0]) {
				if at.After(down) {
					return at
				}
			}
			if lane != nil {
				if g := lane.since(over); len(g) > 0 && len(l.times(slog.LevelWarn, onNode[0])) == 0 {
					return g[0].at
				}
			}
			if time.Now().After(deadline) {
				t.Errorf("%s: the key on the dead master was not back on Redis 10s after the failover", what)
				return time.Time{}
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	for _, c := range []struct {
		l    *logs
		lane *shareLane
		what string
	}{{&la, ia[0], "Backend a"}, {&lb, ib[0], "Backend b"}, {&lt, nil, "Tokens"}} {
		at := recovered(c.l, c.lane, c.what)
		if at.IsZero() {
			continue
		}
		fell := c.l.times(slog.LevelWarn, onNode[0])
		switch {
		case len(fell) > 0:
			t.Logf("%s: the key on the dead master fell back %d time(s), back on Redis %v after the failover",
				c.what, len(fell), at.Sub(over).Round(time.Millisecond))
		case c.lane != nil:
			t.Logf("%s: the key on the dead master kept its lease through the outage, served by Redis %v after the failover",
				c.what, at.Sub(over).Round(time.Millisecond))
		default:
			t.Errorf("%s: the key on the dead master never fell back", c.what)
		}
		if d := at.Sub(over); d > refresh+refresh/2 {
			t.Errorf("%s: back on Redis %v after the failover, more than a refresh (%v)", c.what, d, refresh)
		}
		for node := 1; node < 3; node++ {
			if n := len(c.l.times(slog.LevelWarn, onNode[node])); n > 0 {
				t.Errorf("%s: the key on live master %d fell back %d time(s)", c.what, node, n)
			}
		}
	}
	end := time.Now()
	cancel()
	wg.Wait()

	// The Backends' lanes: on the live masters, their leased shares
	// throughout; on the dead one, no more than the fallback's share.
	for node := range onNode {
		for _, l := range []*shareLane{ia[node], ib[node]} {
			for _, g := range l.since(down) {
				if node != 0 && math.Abs(g.s.Rate-50) > 0.5 {
					t.Errorf("a key on a live master (%d): share %v %v after master 0 died, want its leased 50", node, g.s.Rate, g.at.Sub(down))
				}
				if node == 0 && g.s.Rate > 50+1e-9 {
					t.Errorf("the key on the dead master: share %v %v after, over its leased 50", g.s.Rate, g.at.Sub(down))
				}
			}
		}
	}
	// Tokens: each live key's rate after the kill against its own before.
	mu.Lock()
	defer mu.Unlock()
	if len(errs) > 0 {
		t.Errorf("%d Takes returned an error, the first: %v", len(errs), errs[0])
	}
	for node := 1; node < 3; node++ {
		var before, after int
		for _, g := range grants[node] {
			switch {
			case g.Before(down):
				before++
			case g.Before(end):
				after++
			}
		}
		rb := float64(before) / down.Sub(grants[node][0]).Seconds()
		ra := float64(after) / end.Sub(down).Seconds()
		t.Logf("Tokens, key on live master %d: %.1f/s before the kill, %.1f/s after", node, rb, ra)
		if ra < 0.9*rb {
			t.Errorf("Tokens, key on live master %d: %.1f/s after the kill, under 0.9 of its %.1f/s before", node, ra, rb)
		}
	}
}

// waitDialersGone waits until no go-redis pool goroutine probes a dead
// address (pool.(*ConnPool).tryDial, which sleeps a second between dials
// and exits at its next wake-up once its client is closed).
func waitDialersGone() {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if !bytes.Contains(buf[:n], []byte("(*ConnPool).tryDial")) {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}
