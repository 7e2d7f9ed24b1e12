package main

import (
	"strings"
	"testing"
)

func TestParseAndFormat(t *testing.T) {
	out := `goos: linux
BenchmarkRoundTrip/nopBase/bare-2         	 1000000	        70.0 ns/op	      48 B/op	       1 allocs/op
BenchmarkRoundTrip/nopBase/bare/parallel-2	 1000000	        60.0 ns/op	      48 B/op	       1 allocs/op
BenchmarkRoundTrip/nopBase/sluice-2       	 1000000	       170 ns/op	      48 B/op	       1 allocs/op
BenchmarkRoundTrip/nopBase/bare-2         	 1000000	        80.0 ns/op	      48 B/op	       1 allocs/op
BenchmarkRoundTrip/nopBase/bare-2         	 1000000	        90.0 ns/op	      48 B/op	       1 allocs/op
PASS
`
	rows, err := parse(strings.NewReader(out))
	if err != nil {
		t.Fatal(err)
	}
	got := format(rows)
	want := "| | nopBase | nopBase parallel |\n| --- | --- | --- |\n" +
		"| bare | 80 ns, 1 allocs | 60 ns, 1 allocs |\n" +
		"| sluice | 170 ns, 1 allocs | - |\n"
	if got != want {
		t.Errorf("table:\n%s\nwant:\n%s", got, want)
	}
	if _, err := parse(strings.NewReader("PASS\n")); err == nil {
		t.Error("no results: no error")
	}
}

func TestParseScenarios(t *testing.T) {
	out := `BenchmarkRoundTrip/serial/bare-2         	 1000000	       756 ns/op	     900 B/op	       7 allocs/op
BenchmarkRoundTrip/serial/sluice-2       	 1000000	      1834 ns/op	     900 B/op	       8 allocs/op
BenchmarkRoundTrip/8_goroutines,_1_lane/bare-2 	 1000000	      1028 ns/op	     900 B/op	       7 allocs/op
BenchmarkRoundTrip/8_goroutines,_1_lane/sluice-2 	 1000000	      1864 ns/op	     900 B/op	       8 allocs/op
`
	tb, err := parse(strings.NewReader(out))
	if err != nil {
		t.Fatal(err)
	}
	want := "| | serial | 8 goroutines, 1 lane |\n| --- | --- | --- |\n" +
		"| bare | 756 ns, 7 allocs | 1028 ns, 7 allocs |\n" +
		"| sluice | 1834 ns, 8 allocs | 1864 ns, 8 allocs |\n"
	if got := format(tb); got != want {
		t.Errorf("table:\n%s\nwant:\n%s", got, want)
	}
}

// The multiple of the pair is the median of the rounds' multiples, each
// taken within its round, not the ratio of the medians: a machine whose
// speed drifts between rounds moves both clients of a round alike.
func TestRatioWithinRounds(t *testing.T) {
	out := `BenchmarkRoundTrip/serial/rate+semaphore-2 	 1000 	 100 ns/op
BenchmarkRoundTrip/serial/sluice-2 	 1000 	 120 ns/op
BenchmarkRoundTrip/serial/rate+semaphore-2 	 1000 	 200 ns/op
BenchmarkRoundTrip/serial/sluice-2 	 1000 	 220 ns/op
BenchmarkRoundTrip/serial/rate+semaphore-2 	 1000 	 300 ns/op
BenchmarkRoundTrip/serial/sluice-2 	 1000 	 390 ns/op
`
	tb, err := parse(strings.NewReader(out))
	if err != nil {
		t.Fatal(err)
	}
	want := "| | serial |\n| --- | --- |\n" +
		"| rate+semaphore | 200 ns |\n" +
		"| sluice | 220 ns (1.20× pair) |\n"
	if got := format(tb); got != want {
		t.Errorf("table:\n%s\nwant:\n%s", got, want)
	}
}
