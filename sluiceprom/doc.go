// Package sluiceprom exports what a sluice.Transport does as Prometheus
// metrics.
//
// A Metrics is both halves: a sluice.Observer, which fills the wait-time
// histogram and counts the overloads from the Transport's events, and a prometheus.Collector, which
// reads every other figure from Transport.Stats at scrape time. The
// Observer must be given to sluice.New, before the Transport exists, so
// the set-up is three lines:
//
//	m, _ := sluiceprom.New()
//	tr, _ := sluice.New(nil, sluice.WithObserver(m))
//	m.Watch(tr)
//	prometheus.MustRegister(m)
//
// A Metrics serves one Transport. To export several from one registry,
// register each Metrics under its own constant label with
// prometheus.WrapRegistererWith.
//
// # Metrics
//
// Per lane (label lane):
//
//	sluice_lanes                        gauge    lanes under the label (see Cardinality)
//	sluice_rate_per_second              gauge    the pace now, requests per second; 0: not paced
//	sluice_rate_ceiling_per_second      gauge    the configured rate after headroom; 0: none
//	sluice_in_flight_requests           gauge    attempts sent and not finished
//	sluice_in_flight_limit              gauge    the in-flight limit
//	sluice_cooldown_remaining_seconds   gauge    time left of a cooldown (Retry-After, remaining 0); 0: none
//	sluice_latency_seconds              gauge    smoothed attempt latency
//	sluice_latency_baseline_seconds     gauge    its no-load estimate
//	sluice_saturated                    gauge    1 if the upstream queues the lane's requests
//	sluice_retries_total                counter  retries made
//	sluice_retries_denied_total         counter  retries the retry budget refused
//	sluice_cooldowns_total              counter  pauses of the whole lane
//	sluice_overloaded_total             counter  overloads the server answered (from the
//	                                             Observer; no series before the first)
//
// Per lane and priority level (labels lane, priority: interactive, normal,
// batch):
//
//	sluice_queued_requests              gauge    attempts waiting now
//	sluice_queue_oldest_wait_seconds    gauge    how long the oldest of them has waited
//	sluice_tenants_active               gauge    tenants with attempts queued or in flight
//	sluice_granted_total                counter  attempts granted a token and a slot
//	sluice_cancelled_total              counter  waiters whose context ended first
//	sluice_throttled_total              counter  attempts answered "too many requests"
//	sluice_refused_total                counter  early refusals, by reason (label reason:
//	                                             deadline, max-wait, queue-full, tenant-queue, cost)
//	sluice_wait_seconds                 histogram  time from enqueue to grant
//
// And sluice_events_dropped_total, the events the Observers missed.
//
// # Cardinality
//
// A lane is a key of the Transport (by default the host), so lanes may be
// many, and each lane label makes 96 series (97 once the server answers an
// overload): 12 per lane, 11 per priority
// level (5 of them the refusal reasons) and the histogram's 17 per level at
// the default buckets. Tenants are never a label. WithLaneLabel maps keys to labels
// (several lanes under one label are summed, or for latencies, cooldown and
// oldest wait, the largest is kept), and WithMaxLanes caps the labels: the
// first ones seen keep theirs, later lanes go under "other"; sub-limits
// take at most half of them, later ones going under their lane's label
// and "/other". The default cap is DefaultMaxLanes.
//
// Counters count since the Metrics was made, across lanes that are
// forgotten when idle and made again, so a label's counters only grow;
// what a lane counted between two scrapes and lost before the second is
// not seen.
package sluiceprom
