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
	want := "| benchmark | uncontended | parallel | allocations |\n| --- | --- | --- | --- |\n" +
		"| nopBase/bare | 80 ns | 60 ns | 1 |\n" +
		"| nopBase/sluice | 170 ns | - | 1 |\n"
	if got != want {
		t.Errorf("table:\n%s\nwant:\n%s", got, want)
	}
	if _, err := parse(strings.NewReader("PASS\n")); err == nil {
		t.Error("no results: no error")
	}
}
