package sluiceotel

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/internal/lanegroup"
)

// ScopeName is the instrumentation scope of the metrics.
const ScopeName = "github.com/sluice-go/sluice/sluiceotel"

// Telemetry is a sluice.Observer that records the wait histogram and adds
// span events, and reads the other metrics from the watched Transport's
// Stats when the MeterProvider collects: see the package doc. It is safe
// for concurrent use; its methods never wait for the Transport.
type Telemetry struct {
	groups *lanegroup.Grouper
	tr     atomic.Pointer[sluice.Transport]
	reg    metric.Registration

	wait metric.Float64Histogram
	mu   sync.Mutex // guards waitBy
	// waitBy caches the histogram's attribute sets by lane name, so that an
	// event costs a map lookup. Bounded like the names.
	waitBy map[string]*[lanegroup.Levels][]metric.RecordOption

	lanes, inFlight, queued, tenants                               metric.Int64ObservableUpDownCounter
	limit                                                          metric.Int64ObservableGauge
	rate, ceiling, cooldown, latency, baseline, oldest, saturated  metric.Float64ObservableGauge
	retries, denied, cooldowns, granted, cancelled, throttled, ref metric.Int64ObservableCounter
	dropped                                                        metric.Int64ObservableCounter
}

// New returns a Telemetry with its instruments registered on the
// MeterProvider, or an error naming the option that is not valid or what
// the provider refused.
func New(opts ...Option) (*Telemetry, error) {
	c := config{maxLanes: DefaultMaxLanes}
	for _, o := range opts {
		if err := o(&c); err != nil {
			return nil, err
		}
	}
	if c.mp == nil {
		c.mp = otel.GetMeterProvider()
	}
	m := c.mp.Meter(ScopeName)
	t := &Telemetry{
		groups: lanegroup.New(c.laneLabel, c.maxLanes),
		waitBy: make(map[string]*[lanegroup.Levels][]metric.RecordOption),
	}
	var errs []error
	check := func(err error) { errs = append(errs, err) }
	var err error
	t.wait, err = m.Float64Histogram("sluice.wait", metric.WithUnit("s"),
		metric.WithDescription("Time from enqueue to grant of the attempts granted."),
		metric.WithExplicitBucketBoundaries(DefaultBuckets...))
	check(err)
	i64ud := func(name, unit, desc string) metric.Int64ObservableUpDownCounter {
		i, err := m.Int64ObservableUpDownCounter(name, metric.WithUnit(unit), metric.WithDescription(desc))
		check(err)
		return i
	}
	i64c := func(name, unit, desc string) metric.Int64ObservableCounter {
		i, err := m.Int64ObservableCounter(name, metric.WithUnit(unit), metric.WithDescription(desc))
		check(err)
		return i
	}
	f64g := func(name, unit, desc string) metric.Float64ObservableGauge {
		i, err := m.Float64ObservableGauge(name, metric.WithUnit(unit), metric.WithDescription(desc))
		check(err)
		return i
	}
	t.lanes = i64ud("sluice.lanes", "{lane}", "Lanes under the lane's name: more than 1 where lane keys are mapped or capped.")
	t.inFlight = i64ud("sluice.in_flight", "{request}", "Attempts sent and not finished.")
	t.queued = i64ud("sluice.queue.size", "{request}", "Attempts waiting now.")
	t.tenants = i64ud("sluice.tenants.active", "{tenant}", "Tenants with attempts queued or in flight.")
	t.limit, err = m.Int64ObservableGauge("sluice.in_flight.limit", metric.WithUnit("{request}"), metric.WithDescription("The in-flight limit."))
	check(err)
	t.rate = f64g("sluice.rate", "{request}/s", "Requests per second the lane paces to now; 0 if not paced.")
	t.ceiling = f64g("sluice.rate.ceiling", "{request}/s", "The configured rate after headroom, the most the pace can be; 0 if none.")
	t.cooldown = f64g("sluice.cooldown.remaining", "s", "Time left of the lane's cooldown (Retry-After, remaining 0); 0 if none.")
	t.latency = f64g("sluice.latency", "s", "Smoothed attempt latency, send to body done; 0 until observed.")
	t.baseline = f64g("sluice.latency.baseline", "s", "No-load estimate of the attempt latency; 0 until observed.")
	t.oldest = f64g("sluice.queue.oldest_wait", "s", "How long the longest-waiting queued request has waited; 0 if none.")
	t.saturated = f64g("sluice.saturated", "1", "1 if the upstream was found queueing the lane's requests lately.")
	t.retries = i64c("sluice.retries", "{retry}", "Retries made.")
	t.denied = i64c("sluice.retries.denied", "{retry}", "Retries the retry budget refused.")
	t.cooldowns = i64c("sluice.cooldowns", "{cooldown}", "Pauses of the whole lane (Retry-After, remaining 0).")
	t.granted = i64c("sluice.granted", "{request}", "Attempts granted a token and an in-flight slot.")
	t.cancelled = i64c("sluice.cancelled", "{request}", "Waiters whose context ended before they were sent.")
	t.throttled = i64c("sluice.throttled", "{request}", "Attempts the server answered \"too many requests\" (429, GitHub's 403).")
	t.ref = i64c("sluice.refused", "{request}", "Attempts refused before they were sent, by reason (error.type).")
	t.dropped = i64c("sluice.events.dropped", "{event}", "Events the Transport's Observers missed because they fell behind.")
	if err := errors.Join(errs...); err != nil {
		return nil, errors.Join(errors.New("sluiceotel: creating the instruments"), err)
	}
	t.reg, err = m.RegisterCallback(t.collect, t.lanes, t.inFlight, t.queued, t.tenants, t.limit,
		t.rate, t.ceiling, t.cooldown, t.latency, t.baseline, t.oldest, t.saturated,
		t.retries, t.denied, t.cooldowns, t.granted, t.cancelled, t.throttled, t.ref, t.dropped)
	if err != nil {
		return nil, errors.Join(errors.New("sluiceotel: registering the callback"), err)
	}
	return t, nil
}

// Watch makes the Telemetry read tr's Stats at each collection. Until it
// is called, only the sluice.wait histogram is recorded; and tr must have
// the Telemetry as its Observer (sluice.WithObserver), or there is no
// histogram and no span event. It panics if the
// Telemetry already watches another Transport: a Telemetry serves one.
func (t *Telemetry) Watch(tr *sluice.Transport) {
	if tr == nil {
		panic("sluiceotel: Watch(nil)")
	}
	if !t.tr.CompareAndSwap(nil, tr) && t.tr.Load() != tr {
		panic("sluiceotel: Watch: this Telemetry already watches another Transport")
	}
}

// Close unregisters the metrics' callback, so that the MeterProvider no
// longer reads the Transport. The histogram and span events go on while
// the Transport sends events.
func (t *Telemetry) Close() error {
	return t.reg.Unregister()
}

// Observe records a granted attempt's wait in the histogram, and adds an
// event to the span in ctx. sluice calls it, from the Transport's event
// goroutine; see sluice.WithObserver.
func (t *Telemetry) Observe(ctx context.Context, e sluice.Event) {
	if e.Kind == sluice.EventGranted && e.Priority >= 0 && int(e.Priority) < lanegroup.Levels {
		// The request's context: a trace-based exemplar filter links the
		// sample to its trace.
		t.wait.Record(ctx, e.Wait.Seconds(), t.waitAttrs(e.Lane, e.Priority)...)
	}
	spanEvent(ctx, e)
}

// waitAttrs returns the histogram's options for a lane and level, a slice
// made once so that recording allocates nothing.
func (t *Telemetry) waitAttrs(key string, p sluice.Priority) []metric.RecordOption {
	name := t.groups.Label(key)
	t.mu.Lock()
	defer t.mu.Unlock()
	a := t.waitBy[name]
	if a == nil {
		a = new([lanegroup.Levels][]metric.RecordOption)
		lane := laneAttrs(name)
		for p := range a {
			a[p] = []metric.RecordOption{metric.WithAttributeSet(attribute.NewSet(append(lane[:len(lane):len(lane)], PriorityKey.String(sluice.Priority(p).String()))...))}
		}
		t.waitBy[name] = a
	}
	return a[p]
}

func (t *Telemetry) collect(_ context.Context, o metric.Observer) error {
	tr := t.tr.Load()
	if tr == nil {
		return nil
	}
	groups, s := t.groups.Groups(tr.Stats)
	o.ObserveInt64(t.dropped, int64(s.EventsDropped))
	for _, g := range groups {
		lane := laneAttrs(g.Label)
		la := metric.WithAttributeSet(attribute.NewSet(lane...))
		o.ObserveInt64(t.lanes, int64(g.Lanes), la)
		o.ObserveInt64(t.inFlight, int64(g.InFlight), la)
		o.ObserveInt64(t.limit, int64(g.Limit), la)
		o.ObserveFloat64(t.rate, g.Rate, la)
		o.ObserveFloat64(t.ceiling, g.Ceiling, la)
		o.ObserveFloat64(t.cooldown, g.Cooldown.Seconds(), la)
		o.ObserveFloat64(t.latency, g.Latency.Seconds(), la)
		o.ObserveFloat64(t.baseline, g.Baseline.Seconds(), la)
		sat := 0.0
		if g.Saturated {
			sat = 1
		}
		o.ObserveFloat64(t.saturated, sat, la)
		o.ObserveInt64(t.retries, int64(g.Retries), la)
		o.ObserveInt64(t.denied, int64(g.RetriesDenied), la)
		o.ObserveInt64(t.cooldowns, int64(g.Cooldowns), la)
		for p := range lanegroup.Levels {
			lp := append(lane[:len(lane):len(lane)], PriorityKey.String(sluice.Priority(p).String()))
			pa := metric.WithAttributeSet(attribute.NewSet(lp...))
			q, c := &g.Queue[p], &g.Level[p]
			o.ObserveInt64(t.queued, int64(q.Queued), pa)
			o.ObserveFloat64(t.oldest, q.OldestWait.Seconds(), pa)
			o.ObserveInt64(t.tenants, int64(q.Tenants), pa)
			o.ObserveInt64(t.granted, int64(c.Granted), pa)
			o.ObserveInt64(t.cancelled, int64(c.Cancelled), pa)
			o.ObserveInt64(t.throttled, int64(c.Throttled), pa)
			for r, n := range c.Refused {
				ra := append(lp[:len(lp):len(lp)], semconv.ErrorTypeKey.String(sluice.Reason(r).String()))
				o.ObserveInt64(t.ref, int64(n), metric.WithAttributeSet(attribute.NewSet(ra...)))
			}
		}
	}
	return nil
}

var _ sluice.Observer = (*Telemetry)(nil)
