package results

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

func TestSplice(t *testing.T) {
	doc := "intro\n<!-- results/x begin -->\nold\nold\n<!-- results/x end -->\nafter\n"
	got, err := splice(doc, "x", "| a |\n")
	if err != nil {
		t.Fatal(err)
	}
	want := "intro\n<!-- results/x begin -->\n| a |\n<!-- results/x end -->\nafter\n"
	if got != want {
		t.Errorf("splice:\n%s\nwant:\n%s", got, want)
	}
	if _, err := splice(doc, "y", "z"); err == nil {
		t.Error("splice into a missing block: no error")
	}
	if _, err := splice("<!-- results/x end -->\n<!-- results/x begin -->\n", "x", "z"); err == nil {
		t.Error("splice into markers in the wrong order: no error")
	}
}

func TestWrite(t *testing.T) {
	path := filepath.Join(t.TempDir(), "r.md")
	if err := Write(path, "Title", "go run .", "a note", "| t |\n"); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	for _, want := range []string{"# Title\n", "```sh\ngo run .\n```", "a note\n", "| t |\n"} {
		if !strings.Contains(s, want) {
			t.Errorf("results file lacks %q:\n%s", want, s)
		}
	}
	if !regexp.MustCompile(`Commit \S+, go\S* \w+/\w+, \d+ CPUs, \d{4}-\d\d-\d\d\.`).MatchString(s) {
		t.Errorf("no provenance line:\n%s", s)
	}
}
