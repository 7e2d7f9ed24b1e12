package sluice

import "time"

// controller re-derives a lane's in-flight limit from observed latency.
//
// Until the adaptive controller lands, the limit stays at the configured
// maximum. The lane calls these methods with its mutex held; they must not
// block.
type controller struct{}

// init is called once, when the lane is created.
func (c *controller) init(l *lane) {}

// onDone is called when an attempt finishes: its response body was read to
// EOF or closed (status is the response's status code), or the base
// transport failed (status 0). latency runs from the send to that moment.
// It may change the limit with l.setLimitLocked.
func (c *controller) onDone(l *lane, now time.Time, latency time.Duration, status int) {}

// fill adds the controller's state to a stats snapshot.
func (c *controller) fill(s *LaneStats) {}
