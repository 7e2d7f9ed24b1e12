package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// TestRunShort runs the five policies scaled down twenty times (0.5 s of
// interactive arrivals) and checks the table's shape and the chart. The
// numbers themselves depend on the machine's timing, so they are logged,
// not asserted.
func TestRunShort(t *testing.T) {
	out := filepath.Join(t.TempDir(), "waits.png")
	var buf bytes.Buffer
	if err := run(t.Context(), config{Duration: 500 * time.Millisecond, Out: out}, &buf); err != nil {
		t.Fatalf("run: %v\n%s", err, buf.String())
	}
	s := buf.String()
	t.Log("\n" + s)
	for _, row := range []string{"FIFO ", "strict ", "every 5th to batch ", "aging 100ms "} {
		if !strings.Contains(s, "\n"+row) {
			t.Errorf("no %q row", row)
		}
	}
	if n := strings.Count(s, " of "); n < 5 {
		t.Errorf("%d \"served\" cells, want one per policy", n)
	}
	if !strings.Contains(s, "published: p50 / p99") || !strings.Contains(s, "scaled by 0.05") {
		t.Errorf("no published column or no word of the scaling:\n%s", s)
	}
	png, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(png, []byte("\x89PNG\r\n\x1a\n")) || len(png) < 10_000 {
		t.Errorf("chart: %d bytes, not a PNG of a plot", len(png))
	}
}

func TestRunSVGAndNoChart(t *testing.T) {
	out := filepath.Join(t.TempDir(), "sub", "waits.svg")
	if err := run(t.Context(), config{Duration: 200 * time.Millisecond, Out: out}, &bytes.Buffer{}); err != nil {
		t.Fatal(err)
	}
	if svg, err := os.ReadFile(out); err != nil || !bytes.Contains(svg, []byte("<svg")) {
		t.Errorf("chart: %v, %.40q", err, svg)
	}
	var buf bytes.Buffer
	if err := run(t.Context(), config{Duration: 200 * time.Millisecond}, &buf); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(buf.String(), "chart") {
		t.Error("a chart was announced with no -out")
	}
}

func TestRunRejectsTinyDuration(t *testing.T) {
	if err := run(t.Context(), config{Duration: time.Millisecond}, &bytes.Buffer{}); err == nil {
		t.Error("run with -duration 1ms succeeded")
	}
}
