package sluiceredis

import (
	"context"
	"fmt"
	"math"
	"strings"
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
	t.Helper()
	redistest.Require(t)
	dir := t.TempDir()
	nodes := make([]*redistest.Server, n)
	for i := range nodes {
		s, err := redistest.StartServerArgs("--cluster-enabled", "yes",
			"--cluster-config-file", fmt.Sprintf("%s/nodes-%d.conf", dir, i),
			"--cluster-require-full-coverage", "no", "--dir", dir)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(s.Stop)
		nodes[i] = s
	}
	ctx := context.Background()
	for i, s := range nodes {
		c := redis.NewClient(&redis.Options{Addr: s.Addr()})
		lo, hi := i*16384/n, (i+1)*16384/n-1
		if err := c.Do(ctx, "CLUSTER", "ADDSLOTSRANGE", lo, hi).Err(); err != nil {
			t.Fatal(err)
		}
		if i > 0 {
			host, port, _ := strings.Cut(s.Addr(), ":")
			c0 := redis.NewClient(&redis.Options{Addr: nodes[0].Addr()})
			if err := c0.ClusterMeet(ctx, host, port).Err(); err != nil {
				t.Fatal(err)
			}
			c0.Close()
		}
		c.Close()
	}
	deadline := time.Now().Add(20 * time.Second)
	for _, s := range nodes {
		c := redis.NewClient(&redis.Options{Addr: s.Addr()})
		for {
			info, _ := c.ClusterInfo(ctx).Result()
			if strings.Contains(info, "cluster_state:ok") && strings.Contains(info, fmt.Sprintf("cluster_known_nodes:%d", n)) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("cluster not ok in 20s: %s", info)
			}
			time.Sleep(50 * time.Millisecond)
		}
		c.Close()
	}
	return nodes
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
	c := newCluster()
	onNode := map[int]string{}
	for k := 0; len(onNode) < 3; k++ {
		key := fmt.Sprintf("api-%d", k)
		slot, err := c.ClusterKeySlot(context.Background(), newKeys(DefaultPrefix, key).shares()).Result()
		if err != nil {
			t.Fatal(err)
		}
		if node := int(slot) * 3 / 16384; onNode[node] == "" {
			onNode[node] = key
		}
	}
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
