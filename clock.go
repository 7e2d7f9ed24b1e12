package sluice

import "time"

// clock is a lane's clock: the time since the lane was created, on the
// monotonic clock, as a time.Duration. A reading is one clock read, where
// time.Now makes two (wall and monotonic), and an integer to compare and
// subtract. Every instant inside a lane is a reading of its clock; a
// time.Time is made only for what leaves the lane (headers' instants come
// in through ticks, Stats and events go out through timeOf).
//
// A clock is not safe for concurrent use; the lane's mutex guards it.
type clock struct {
	epoch   time.Time
	epochNS int64         // epoch.UnixNano()
	last    time.Duration // the latest reading used; see tick
}

func newClock() clock {
	now := time.Now()
	return clock{epoch: now, epochNS: now.UnixNano()}
}

// read reads the clock. It needs no lock: the epoch never changes.
func (c *clock) read() time.Duration { return time.Since(c.epoch) }

// timeOf returns the time.Time of a reading d.
func (c *clock) timeOf(d time.Duration) time.Time { return c.epoch.Add(d) }

// ticks returns the reading of the clock at t.
func (c *clock) ticks(t time.Time) time.Duration { return t.Sub(c.epoch) }

// tick reads the clock, never earlier than a reading already used: every
// part of the lane sees time that never runs backwards, so no interval is
// counted twice (golang/go#65508; the bucket also guards itself).
func (c *clock) tick() time.Duration { return c.at(c.read()) }

// at returns d, or the latest reading already used if d is earlier; see tick.
func (c *clock) at(d time.Duration) time.Duration {
	if d < c.last {
		return c.last
	}
	c.last = d
	return d
}

// peek reads the clock for what is no use of the lane (Stats, a Leaser's
// calls): never earlier than a reading already used, and not recorded as
// one, so that the lane's last use (see lane.forget) does not move.
func (c *clock) peek() time.Duration { return max(c.read(), c.last) }
