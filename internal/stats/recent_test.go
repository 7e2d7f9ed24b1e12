package stats

import (
	"testing"
	"time"
)

func TestRecentForgets(t *testing.T) {
	const period = time.Minute
	var r Recent
	// A first minute of slow waits, then a minute of fast ones.
	for i := range 100 {
		r.Record(time.Duration(i)*period/100, period, 10*time.Second)
	}
	for i := range 100 {
		r.Record(period+time.Duration(i)*period/100, period, 10*time.Millisecond)
	}
	// Both minutes count: the p99 is a slow wait, the p25 a fast one.
	now := 2*period - time.Second
	if got := r.Quantile(now, period, 0.99); got < 9*time.Second || got > 11*time.Second {
		t.Errorf("p99 over both periods = %v, want about 10s", got)
	}
	if got := r.Quantile(now, period, 0.25); got < 9*time.Millisecond || got > 11*time.Millisecond {
		t.Errorf("p25 over both periods = %v, want about 10ms", got)
	}
	// A third minute: the slow one is forgotten.
	r.Record(2*period+time.Second, period, 10*time.Millisecond)
	if got := r.Quantile(2*period+2*time.Second, period, 0.99); got > 11*time.Millisecond {
		t.Errorf("p99 after the slow minute passed = %v, want about 10ms", got)
	}
	// Nothing recorded for a period: the last one alone, then nothing.
	if got := r.Quantile(3*period+2*time.Second, period, 0.5); got < 9*time.Millisecond || got > 11*time.Millisecond {
		t.Errorf("p50 a period later = %v, want the last period's 10ms", got)
	}
	if got := r.Quantile(4*period+2*time.Second, period, 0.5); got != 0 {
		t.Errorf("p50 two periods later = %v, want 0", got)
	}
}

func TestQuantile2MatchesOne(t *testing.T) {
	var a, b, both Histogram
	for i := 1; i <= 1000; i++ {
		d := time.Duration(i*i) * time.Microsecond
		if i%3 == 0 {
			a.Record(d)
		} else {
			b.Record(d)
		}
		both.Record(d)
	}
	a.Record(0)
	both.Record(0)
	for _, q := range []float64{0, 0.001, 0.25, 0.5, 0.9, 0.99, 1} {
		if got, want := quantile2(&a, &b, q), both.Quantile(q); got != want {
			t.Errorf("quantile2(%v) = %v, want %v", q, got, want)
		}
	}
}
