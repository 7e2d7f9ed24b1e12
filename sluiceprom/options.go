package sluiceprom

import (
	"fmt"
	"slices"
)

// DefaultMaxLanes is the default cap on lane labels: see WithMaxLanes.
const DefaultMaxLanes = 50

// DefaultBuckets are the wait-time histogram's default bucket bounds, in
// seconds: a fast path that does not wait falls in the first.
var DefaultBuckets = []float64{0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}

// An Option configures a Metrics; see New.
type Option func(*config) error

type config struct {
	laneLabel func(string) string
	maxLanes  int
	buckets   []float64
}

// WithLaneLabel sets the lane label of a lane key, f(key) instead of the
// key itself: for example to strip a port or to group an API's regional
// hosts. Lanes under one label are summed (see the package doc). f must be
// safe for concurrent use and return the same label for the same key.
func WithLaneLabel(f func(key string) string) Option {
	return func(c *config) error {
		if f == nil {
			return fmt.Errorf("sluiceprom: WithLaneLabel(nil)")
		}
		c.laneLabel = f
		return nil
	}
}

// WithMaxLanes caps the lane labels at n: the first n seen keep theirs for
// the Metrics' life, and later lanes are exported under "other"; a lane's
// sub-limits count against the cap too. 0 lifts the cap: every key ever
// seen keeps its label, so use it only over a bounded set of keys. Default
// DefaultMaxLanes.
func WithMaxLanes(n int) Option {
	return func(c *config) error {
		if n < 0 {
			return fmt.Errorf("sluiceprom: WithMaxLanes(%d): must not be negative", n)
		}
		c.maxLanes = n
		return nil
	}
}

// WithBuckets sets the wait-time histogram's bucket upper bounds, in
// seconds, increasing. Default DefaultBuckets.
func WithBuckets(b ...float64) Option {
	return func(c *config) error {
		if len(b) == 0 {
			return fmt.Errorf("sluiceprom: WithBuckets(): no bucket")
		}
		for i, v := range b {
			if !(v > 0) || (i > 0 && v <= b[i-1]) {
				return fmt.Errorf("sluiceprom: WithBuckets(%v): bounds must be positive and increasing", b)
			}
		}
		c.buckets = slices.Clone(b)
		return nil
	}
}
