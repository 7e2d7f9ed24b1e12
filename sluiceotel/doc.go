// Package sluiceotel exports what a sluice.Transport does to
// OpenTelemetry: metrics on a metric.MeterProvider, and events on the span
// of each request.
//
// A Telemetry is a sluice.Observer: it records the sluice.wait histogram
// and adds span events as the Transport's events arrive, and reads every
// other figure from Transport.Stats when the MeterProvider collects. The
// Observer must be given to sluice.New, before the Transport exists, so
// the set-up is three lines:
//
//	tel, _ := sluiceotel.New(sluiceotel.WithMeterProvider(mp))
//	tr, _ := sluice.New(nil, sluice.WithObserver(tel))
//	tel.Watch(tr)
//	client := &http.Client{Transport: otelhttp.NewTransport(tr)}
//
// # Span events
//
// With otelhttp (or any tracing) around the Transport, the span in the
// request's context gets an event for each step of the request: sluice.queued
// (sluice.queued: the queue's length), sluice.granted (sluice.wait_time: how
// long it waited, seconds), sluice.refused (error.type: the reason),
// sluice.throttled (http.response.status_code), sluice.cooldown (sluice.cause,
// sluice.wait_time: its length), sluice.retry (http.request.resend_count,
// http.response.status_code or error.type, sluice.wait_time: the backoff) and
// sluice.rate_changed (sluice.cause, sluice.rate.from, sluice.rate.to) and
// sluice.overloaded (sluice.cause: status or stream, http.response.status_code
// for a status, sluice.in_flight.limit: the limit it left, sluice.wait_time:
// the lane's pause, 0 if none); sluice.granted and sluice.refused carry
// sluice.attempt. The client span then shows where its time went: queued
// for the rate, cooling down after a 429, or on the wire.
//
// Events reach an Observer a few microseconds after they happen, so each
// span event is stamped with the time the event happened, not the time it
// arrived. An event that arrives after its span ended is not recorded: a
// refusal returns at once, and otelhttp ends the span on the error, which
// it records as the span's status (a *sluice.RejectedError names the
// reason); the refused event itself is recorded only when the span
// outlives it. Transport.WaitEvents waits for the events so far.
//
// # Metrics
//
// Per lane, attributed server.address (and server.port) when the lane's
// name is a host, as the default lane key is, and sluice.lane otherwise:
//
//	sluice.lanes               updown  {lane}       lanes under the name (see Cardinality)
//	sluice.rate                gauge   {request}/s  the pace now; 0: not paced
//	sluice.rate.ceiling        gauge   {request}/s  the configured rate after headroom; 0: none
//	sluice.in_flight           updown  {request}    attempts sent and not finished
//	sluice.in_flight.limit     gauge   {request}    the in-flight limit
//	sluice.cooldown.remaining  gauge   s            time left of a cooldown; 0: none
//	sluice.latency             gauge   s            smoothed attempt latency
//	sluice.latency.baseline    gauge   s            its no-load estimate
//	sluice.saturated           gauge   1            1 if the upstream queues the lane's requests
//	sluice.retries             counter {retry}      retries made
//	sluice.retries.denied      counter {retry}      retries the retry budget refused
//	sluice.cooldowns           counter {cooldown}   pauses of the whole lane
//
// Per lane and priority level (sluice.priority: interactive, normal,
// batch):
//
//	sluice.queue.size          updown  {request}    attempts waiting now
//	sluice.queue.oldest_wait   gauge   s            how long the oldest of them has waited
//	sluice.tenants.active      updown  {tenant}     tenants with attempts queued or in flight
//	sluice.granted             counter {request}    attempts granted a token and a slot
//	sluice.cancelled           counter {request}    waiters whose context ended first
//	sluice.throttled           counter {request}    attempts answered "too many requests"
//	sluice.refused             counter {request}    early refusals, by error.type: deadline,
//	                                                max-wait, queue-full, tenant-queue, cost
//	sluice.wait                histogram s          time from enqueue to grant
//
// And sluice.events.dropped, the events the Observers missed. The counters
// and up-down counters are observable (cumulative); sluice.wait is recorded
// with the request's context, so a trace-based exemplar filter links its
// samples to their traces.
//
// # Cardinality
//
// A lane is a key of the Transport (by default the host), so lanes may be
// many; each lane name makes up to 48 series: 12 per lane, 11 per priority
// level (5 of them the refusal reasons) and a histogram per level that
// granted requests. Tenants are never an attribute. WithLaneLabel maps keys to names (several lanes
// under one name are summed, or for latencies, cooldown and oldest wait,
// the largest is kept), and WithMaxLanes caps the names: the first ones
// seen keep theirs, later lanes go under sluice.lane "other"; sub-limits
// take at most half of them, later ones going under their lane's name and
// "/other". The default cap is DefaultMaxLanes.
//
// Counters count since the Telemetry was made, across lanes that are
// forgotten when idle and made again, so they only grow; what a lane
// counted between two collections and lost before the second is not seen.
package sluiceotel
