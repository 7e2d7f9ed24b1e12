package sluiceotel

import (
	"fmt"

	"go.opentelemetry.io/otel/metric"
)

// DefaultMaxLanes is the default cap on lanes with attributes of their
// own: see WithMaxLanes.
const DefaultMaxLanes = 50

// DefaultBuckets are the bucket bounds, in seconds, that the sluice.wait
// histogram advises; a View can set others.
var DefaultBuckets = []float64{0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}

// An Option configures a Telemetry; see New.
type Option func(*config) error

type config struct {
	mp        metric.MeterProvider
	laneLabel func(string) string
	maxLanes  int
}

// WithMeterProvider sets the MeterProvider the metrics are registered on.
// Default: otel.GetMeterProvider() at the time of New.
func WithMeterProvider(mp metric.MeterProvider) Option {
	return func(c *config) error {
		if mp == nil {
			return fmt.Errorf("sluiceotel: WithMeterProvider(nil)")
		}
		c.mp = mp
		return nil
	}
}

// WithLaneLabel sets the name a lane's metrics are attributed to, f(key)
// instead of the key itself: for example to group an API's regional hosts.
// Lanes under one name are summed (see the package doc). f must be safe for
// concurrent use and return the same name for the same key.
func WithLaneLabel(f func(key string) string) Option {
	return func(c *config) error {
		if f == nil {
			return fmt.Errorf("sluiceotel: WithLaneLabel(nil)")
		}
		c.laneLabel = f
		return nil
	}
}

// WithMaxLanes caps the lane names at n: the first n seen keep theirs for
// the Telemetry's life, and later lanes are attributed to sluice.lane
// "other"; a lane's sub-limits count against the cap too. 0 lifts the
// cap: every key ever seen keeps its name, so use it only over a bounded
// set of keys. Default DefaultMaxLanes.
func WithMaxLanes(n int) Option {
	return func(c *config) error {
		if n < 0 {
			return fmt.Errorf("sluiceotel: WithMaxLanes(%d): must not be negative", n)
		}
		c.maxLanes = n
		return nil
	}
}
