package sluicestatus

import (
	"errors"
	"fmt"
	"time"
)

// Defaults.
const (
	// DefaultInterval is how often the Handler samples the Transport: once a
	// second, the resolution a person watching a chart can use.
	DefaultInterval = time.Second
	// DefaultHistory is how far back the charts go: 10 minutes, enough to
	// see a cooldown and the recovery after it.
	DefaultHistory = 10 * time.Minute
	// DefaultMaxLanes is how many lanes the page shows: the 20 busiest.
	DefaultMaxLanes = 20
)

// Bounds on the options: they keep one sample's cost and the memory of the
// history (MaxLanes x History / Interval samples of 128 bytes) small.
const (
	minInterval = 10 * time.Millisecond
	maxSamples  = 100_000 // per lane: History / Interval
	maxLanes    = 1000
)

// ErrInvalidOption is the errors.Is target for every error New returns
// because of a bad option.
var ErrInvalidOption = errors.New("sluicestatus: invalid option")

// An Option configures a Handler.
type Option interface {
	apply(*config) error
}

type optionFunc func(*config) error

func (f optionFunc) apply(c *config) error { return f(c) }

type config struct {
	interval time.Duration
	history  time.Duration
	maxLanes int
}

func defaultConfig() config {
	return config{interval: DefaultInterval, history: DefaultHistory, maxLanes: DefaultMaxLanes}
}

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalidOption}, args...)...)
}

// WithInterval sets how often the Handler samples the Transport's Stats.
// Default DefaultInterval (1 s); at least 10 ms.
func WithInterval(d time.Duration) Option {
	return optionFunc(func(c *config) error {
		if d < minInterval {
			return invalid("WithInterval(%v): must be at least %v", d, minInterval)
		}
		c.interval = d
		return nil
	})
}

// WithHistory sets how much history the charts show; the Handler keeps
// History / Interval samples per lane shown. Default DefaultHistory
// (10 minutes); at least one interval and at most 100,000 of them.
func WithHistory(d time.Duration) Option {
	return optionFunc(func(c *config) error {
		if d <= 0 {
			return invalid("WithHistory(%v): must be positive", d)
		}
		c.history = d
		return nil
	})
}

// WithMaxLanes sets how many lanes the page shows, 1 to 1000: the busiest
// ones (see Handler). Default DefaultMaxLanes (20).
func WithMaxLanes(n int) Option {
	return optionFunc(func(c *config) error {
		if n < 1 || n > maxLanes {
			return invalid("WithMaxLanes(%d): must be in [1, %d]", n, maxLanes)
		}
		c.maxLanes = n
		return nil
	})
}

// validate checks what no single option can: History against Interval.
func (c *config) validate() error {
	n := c.history / c.interval
	if n < 1 {
		return invalid("WithHistory(%v): shorter than the interval %v", c.history, c.interval)
	}
	if n > maxSamples {
		return invalid("WithHistory(%v): %d samples of %v, more than %d", c.history, n, c.interval, maxSamples)
	}
	return nil
}

// samples is how many samples a lane's history holds.
func (c *config) samples() int { return int(c.history / c.interval) }
