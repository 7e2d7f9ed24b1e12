package sluiceprom

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/internal/lanegroup"
)

// Metrics is a sluice.Observer and a prometheus.Collector for one
// Transport: see the package doc. It is safe for concurrent use; its
// methods never wait for the Transport.
type Metrics struct {
	groups *lanegroup.Grouper
	tr     atomic.Pointer[sluice.Transport]

	wait *prometheus.HistogramVec
	// overloaded counts the EventOverloaded, by lane label.
	overloaded *prometheus.CounterVec
	mu         sync.Mutex // guards waitBy
	// waitBy caches the histogram's children by label, so that an event
	// costs a map lookup. Bounded like the labels.
	waitBy map[string]*[lanegroup.Levels]prometheus.Observer
}

// New returns a Metrics with the options applied, or an error naming the
// option that is not valid.
func New(opts ...Option) (*Metrics, error) {
	c := config{maxLanes: DefaultMaxLanes, buckets: DefaultBuckets}
	for _, o := range opts {
		if err := o(&c); err != nil {
			return nil, err
		}
	}
	return &Metrics{
		groups: lanegroup.New(c.laneLabel, c.maxLanes),
		wait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "sluice_wait_seconds",
			Help:    "Time from enqueue to grant of the attempts granted.",
			Buckets: c.buckets,
		}, []string{"lane", "priority"}),
		overloaded: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_overloaded_total",
			Help: "Overloads the server answered (529, 502/503/504 without Retry-After, a stream's first event about overload).",
		}, []string{"lane"}),
		waitBy: make(map[string]*[lanegroup.Levels]prometheus.Observer),
	}, nil
}

// Watch makes the Collector read tr's Stats. Until it is called, only the
// wait-time histogram is collected; and tr must have the Metrics as its
// Observer (sluice.WithObserver), or the histogram stays empty. It panics if the Metrics already
// watches another Transport: a Metrics serves one.
func (m *Metrics) Watch(tr *sluice.Transport) {
	if tr == nil {
		panic("sluiceprom: Watch(nil)")
	}
	if !m.tr.CompareAndSwap(nil, tr) && m.tr.Load() != tr {
		panic("sluiceprom: Watch: this Metrics already watches another Transport")
	}
}

// Observe records the waits of granted attempts and counts the overloads.
// sluice calls it, from the Transport's event goroutine; see
// sluice.WithObserver.
func (m *Metrics) Observe(_ context.Context, e sluice.Event) {
	if e.Kind == sluice.EventOverloaded {
		m.overloaded.WithLabelValues(m.groups.Label(e.Lane)).Inc()
		return
	}
	if e.Kind != sluice.EventGranted || e.Priority < 0 || int(e.Priority) >= lanegroup.Levels {
		return
	}
	m.waitOf(m.groups.Label(e.Lane))[e.Priority].Observe(e.Wait.Seconds())
}

// waitOf returns the wait histograms of label, one per level.
func (m *Metrics) waitOf(label string) *[lanegroup.Levels]prometheus.Observer {
	m.mu.Lock()
	defer m.mu.Unlock() // WithLabelValues panics on a label it refuses
	obs := m.waitBy[label]
	if obs == nil {
		obs = new([lanegroup.Levels]prometheus.Observer)
		for p := range obs {
			obs[p] = m.wait.WithLabelValues(label, sluice.Priority(p).String())
		}
		m.waitBy[label] = obs
	}
	return obs
}

var (
	lane      = []string{"lane"}
	level     = []string{"lane", "priority"}
	byReason  = []string{"lane", "priority", "reason"}
	descLanes = prometheus.NewDesc("sluice_lanes", "Lanes under the lane label: more than 1 where lane keys are mapped or capped.", lane, nil)
	descRate  = prometheus.NewDesc("sluice_rate_per_second", "Requests per second the lane paces to now; 0 if not paced.", lane, nil)
	descCeil  = prometheus.NewDesc("sluice_rate_ceiling_per_second", "The configured rate after headroom, the most the pace can be; 0 if none.", lane, nil)
	descInFl  = prometheus.NewDesc("sluice_in_flight_requests", "Attempts sent and not finished.", lane, nil)
	descLimit = prometheus.NewDesc("sluice_in_flight_limit", "The in-flight limit.", lane, nil)
	descCool  = prometheus.NewDesc("sluice_cooldown_remaining_seconds", "Time left of the lane's cooldown (Retry-After, remaining 0); 0 if none.", lane, nil)
	descLat   = prometheus.NewDesc("sluice_latency_seconds", "Smoothed attempt latency, send to body done; 0 until observed.", lane, nil)
	descBase  = prometheus.NewDesc("sluice_latency_baseline_seconds", "No-load estimate of the attempt latency; 0 until observed.", lane, nil)
	descSat   = prometheus.NewDesc("sluice_saturated", "1 if the upstream was found queueing the lane's requests lately.", lane, nil)
	descRetry = prometheus.NewDesc("sluice_retries_total", "Retries made.", lane, nil)
	descDeny  = prometheus.NewDesc("sluice_retries_denied_total", "Retries the retry budget refused.", lane, nil)
	descCools = prometheus.NewDesc("sluice_cooldowns_total", "Pauses of the whole lane (Retry-After, remaining 0).", lane, nil)

	descQueued  = prometheus.NewDesc("sluice_queued_requests", "Attempts waiting now.", level, nil)
	descOldest  = prometheus.NewDesc("sluice_queue_oldest_wait_seconds", "How long the longest-waiting queued request has waited; 0 if none.", level, nil)
	descTenants = prometheus.NewDesc("sluice_tenants_active", "Tenants with attempts queued or in flight.", level, nil)
	descGranted = prometheus.NewDesc("sluice_granted_total", "Attempts granted a token and an in-flight slot.", level, nil)
	descCancel  = prometheus.NewDesc("sluice_cancelled_total", "Waiters whose context ended before they were sent.", level, nil)
	descThrot   = prometheus.NewDesc("sluice_throttled_total", "Attempts the server answered \"too many requests\" (429, GitHub's 403).", level, nil)
	descRefused = prometheus.NewDesc("sluice_refused_total", "Attempts refused before they were sent, by reason.", byReason, nil)

	descDropped = prometheus.NewDesc("sluice_events_dropped_total", "Events the Transport's Observers missed because they fell behind.", nil, nil)

	descs = []*prometheus.Desc{descLanes, descRate, descCeil, descInFl, descLimit, descCool, descLat, descBase, descSat,
		descRetry, descDeny, descCools, descQueued, descOldest, descTenants, descGranted, descCancel, descThrot, descRefused, descDropped}

	reasons [lanegroup.Reasons]string
)

func init() {
	for r := range reasons {
		reasons[r] = sluice.Reason(r).String()
	}
}

// Describe sends the descriptions of every metric the Metrics collects.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range descs {
		ch <- d
	}
	m.wait.Describe(ch)
	m.overloaded.Describe(ch)
}

// Collect reads the watched Transport's Stats and sends the metrics.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	m.wait.Collect(ch)
	m.overloaded.Collect(ch)
	tr := m.tr.Load()
	if tr == nil {
		return
	}
	groups, s := m.groups.Groups(tr.Stats)
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	counter(descDropped, s.EventsDropped)
	for _, g := range groups {
		l := g.Label
		gauge(descLanes, float64(g.Lanes), l)
		gauge(descRate, g.Rate, l)
		gauge(descCeil, g.Ceiling, l)
		gauge(descInFl, float64(g.InFlight), l)
		gauge(descLimit, float64(g.Limit), l)
		gauge(descCool, g.Cooldown.Seconds(), l)
		gauge(descLat, g.Latency.Seconds(), l)
		gauge(descBase, g.Baseline.Seconds(), l)
		gauge(descSat, b2f(g.Saturated), l)
		counter(descRetry, g.Retries, l)
		counter(descDeny, g.RetriesDenied, l)
		counter(descCools, g.Cooldowns, l)
		for p := range lanegroup.Levels {
			ps := sluice.Priority(p).String()
			q, c := &g.Queue[p], &g.Level[p]
			gauge(descQueued, float64(q.Queued), l, ps)
			gauge(descOldest, q.OldestWait.Seconds(), l, ps)
			gauge(descTenants, float64(q.Tenants), l, ps)
			counter(descGranted, c.Granted, l, ps)
			counter(descCancel, c.Cancelled, l, ps)
			counter(descThrot, c.Throttled, l, ps)
			for r, n := range c.Refused {
				counter(descRefused, n, l, ps, reasons[r])
			}
		}
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

var _ interface {
	sluice.Observer
	prometheus.Collector
} = (*Metrics)(nil)
