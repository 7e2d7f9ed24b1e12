package sluiceredis

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// startChildren starts n processes of this test binary, each running the
// test named child with childEnv set to role, FLEET_PROC to its index and
// env besides. The returned wait waits for them all, failing t for any
// that failed, and returns, for each, the last line of its output that
// starts with prefix, with prefix cut ("" if none, or if prefix is "").
func startChildren(ctx context.Context, t *testing.T, n int, child, role, prefix string, env ...string) (wait func() []string) {
	var wg sync.WaitGroup
	reports := make([]string, n)
	for i := range n {
		cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^"+child+"$", "-test.v")
		cmd.SysProcAttr = childProcAttr()
		cmd.Env = append(os.Environ(), childEnv+"="+role, "FLEET_PROC="+strconv.Itoa(i))
		cmd.Env = append(cmd.Env, env...)
		wg.Go(func() {
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Errorf("process %d: %v\n%s", i, err, out)
			}
			if prefix == "" {
				return
			}
			sc := bufio.NewScanner(strings.NewReader(string(out)))
			for sc.Scan() {
				if s, ok := strings.CutPrefix(sc.Text(), prefix); ok {
					reports[i] = s
				}
			}
		})
	}
	return func() []string {
		wg.Wait()
		return reports
	}
}
