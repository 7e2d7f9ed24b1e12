// Command docscheck checks the repository's documentation, for CI:
//
//   - the user-facing documents (README.md, CHANGELOG.md, docs/ and
//     bench/README.md) contain no words that belong to the project's
//     history (rounds of work, before/now columns, tracker numbers,
//     anecdotes of one machine) and point at no file outside the
//     repository;
//   - every relative link in them leads to a file of the repository;
//   - README.md is at most -readme-lines lines long;
//   - every exported identifier in every module's non-test, non-internal,
//     non-example Go code has a doc comment;
//   - every Example function has an output comment, and so runs under go
//     test, unless its doc comment says it is "compiled, not run" (such
//     examples are listed).
//
// Run it from the repository root, where go.work lists the modules:
//
//	go run ./tools/docscheck
//
// It prints every finding and exits with status 1 if there is one.
package main

import (
	"bufio"
	"flag"
	"fmt"
	"go/ast"
	"go/doc"
	"go/parser"
	"go/token"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
)

// historyWords are patterns that belong to the project's history, which
// is kept in git, not in the documents that speak to users. Each comes with
// what it catches.
var historyWords = []struct {
	re   *regexp.Regexp
	what string
}{
	{regexp.MustCompile(`(?i)\bsessions?\b`), "a round of work"},
	{regexp.MustCompile(`(?i)\brounds? of (work|the team)`), "a round of work"},
	{regexp.MustCompile(`(?i)\|([^|]*\s)?(before|now|after)\s*(\||$)`), "a before/now column"},
	{regexp.MustCompile(`(?i)\b(before|after) (the|this) (change|fix|work|branch|merge)\b`), "a before/after of a change"},
	{regexp.MustCompile(`(?i)\bbefore:\s`), "a before/after of a change"},
	{regexp.MustCompile(`(^|[\s(\[,;])#[0-9]+\b`), "a tracker number"},
	{regexp.MustCompile(`(?i)\bissues? [0-9]+`), "a tracker number"},
	{regexp.MustCompile(`(?i)\b(this|our|the project's|my) ([0-9]+-core |shared |loaded )?(machine|laptop|box|vm)\b`), "an anecdote of one machine"},
	{regexp.MustCompile(`(?i)\bhelpers?\b`), "a worker of the project"},
	{regexp.MustCompile(`(?i)\b(tried and (left out|removed)|was tried)\b`), "the history of a choice"},
	{regexp.MustCompile(`NOTES\.md|DESIGN\.md|\.\./shared`), "a file outside the repository"},
}

func main() {
	readmeLines := flag.Int("readme-lines", 360, "the most lines README.md may have")
	flag.Parse()
	var findings []string
	report := func(format string, args ...any) { findings = append(findings, fmt.Sprintf(format, args...)) }

	docs, err := documents()
	if err != nil {
		fmt.Fprintln(os.Stderr, "docscheck:", err)
		os.Exit(2)
	}
	for _, path := range docs {
		if err := checkLinks(path, report); err != nil {
			fmt.Fprintln(os.Stderr, "docscheck:", err)
			os.Exit(2)
		}
		if err := checkHistory(path, report); err != nil {
			fmt.Fprintln(os.Stderr, "docscheck:", err)
			os.Exit(2)
		}
	}
	if n, err := countLines("README.md"); err != nil {
		fmt.Fprintln(os.Stderr, "docscheck:", err)
		os.Exit(2)
	} else if n > *readmeLines {
		report("README.md: %d lines, over %d", n, *readmeLines)
	}

	mods, err := modules("go.work")
	if err != nil {
		fmt.Fprintln(os.Stderr, "docscheck:", err)
		os.Exit(2)
	}
	var notRun []string
	for _, mod := range mods {
		if err := checkModule(mod, report, &notRun); err != nil {
			fmt.Fprintln(os.Stderr, "docscheck:", err)
			os.Exit(2)
		}
	}
	for _, e := range notRun {
		fmt.Printf("compiled, not run: %s\n", e)
	}
	for _, f := range findings {
		fmt.Println(f)
	}
	if len(findings) > 0 {
		fmt.Printf("docscheck: %d findings\n", len(findings))
		os.Exit(1)
	}
}

// documents returns the user-facing documents: README.md, CHANGELOG.md,
// bench/README.md and every markdown file under docs/.
func documents() ([]string, error) {
	out := []string{"README.md", "CHANGELOG.md", "bench/README.md"}
	err := filepath.WalkDir("docs", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && strings.HasSuffix(path, ".md") {
			out = append(out, path)
		}
		return nil
	})
	return out, err
}

// checkHistory reports every line of the file at path that matches a
// history pattern.
func checkHistory(path string, report func(string, ...any)) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		for _, w := range historyWords {
			if m := w.re.FindString(line); m != "" {
				report("%s:%d: %s (%q): history belongs in git log", path, n, w.what, strings.TrimSpace(m))
			}
		}
	}
	return sc.Err()
}

// link matches a markdown link's target.
var link = regexp.MustCompile(`\]\(([^)\s]+)\)`)

// checkLinks reports every relative link of the markdown file at path
// whose file does not exist.
func checkLinks(path string, report func(string, ...any)) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	for n, line := range strings.Split(string(b), "\n") {
		for _, m := range link.FindAllStringSubmatch(line, -1) {
			target, _, _ := strings.Cut(m[1], "#")
			if target == "" || strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			if _, err := os.Stat(filepath.Join(filepath.Dir(path), target)); err != nil {
				report("%s:%d: link to %s: no such file", path, n+1, target)
			}
		}
	}
	return nil
}

func countLines(path string) (int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	return strings.Count(string(b), "\n"), nil
}

// modules returns the directories of the modules listed by a go.work
// file's use directives.
func modules(path string) ([]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var dirs []string
	inUse := false
	for _, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		switch {
		case strings.HasPrefix(line, "use ("):
			inUse = true
		case inUse && line == ")":
			inUse = false
		case inUse && line != "" && !strings.HasPrefix(line, "//"):
			dirs = append(dirs, filepath.Clean(line))
		case strings.HasPrefix(line, "use "):
			dirs = append(dirs, filepath.Clean(strings.TrimSpace(strings.TrimPrefix(line, "use"))))
		}
	}
	if len(dirs) == 0 {
		return nil, fmt.Errorf("%s: no use directive", path)
	}
	return dirs, nil
}

// checkModule checks every package directory of the module at root,
// leaving out nested modules, which are checked on their own.
func checkModule(root string, report func(string, ...any), notRun *[]string) error {
	return filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			return nil
		}
		if path != root {
			base := d.Name()
			if base == "testdata" || strings.HasPrefix(base, ".") || strings.HasPrefix(base, "_") {
				return filepath.SkipDir
			}
			if _, err := os.Stat(filepath.Join(path, "go.mod")); err == nil {
				return filepath.SkipDir
			}
		}
		return checkDir(path, report, notRun)
	})
}

// checkDir checks the Go files of one directory.
func checkDir(dir string, report func(string, ...any), notRun *[]string) error {
	fset := token.NewFileSet()
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	pkgs := map[string]map[string]*ast.File{} // package name → file name → file
	for _, e := range entries {
		if e.IsDir() || !strings.HasSuffix(e.Name(), ".go") {
			continue
		}
		name := filepath.Join(dir, e.Name())
		f, err := parser.ParseFile(fset, name, nil, parser.ParseComments|parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		if pkgs[f.Name.Name] == nil {
			pkgs[f.Name.Name] = map[string]*ast.File{}
		}
		pkgs[f.Name.Name][name] = f
	}
	parts := strings.Split(filepath.ToSlash(dir), "/")
	internal := slices.Contains(parts, "internal")
	example := slices.Contains(parts, "examples")
	for _, pkgName := range slices.Sorted(maps.Keys(pkgs)) {
		files := pkgs[pkgName]
		var tests []*ast.File
		for _, name := range slices.Sorted(maps.Keys(files)) {
			f := files[name]
			if strings.HasSuffix(name, "_test.go") {
				tests = append(tests, f)
				continue
			}
			if internal || example || pkgName == "main" {
				continue
			}
			checkExported(fset, f, report)
		}
		for _, ex := range doc.Examples(tests...) {
			if ex.Output != "" || ex.EmptyOutput {
				continue
			}
			name := "Example" + ex.Name
			if ex.Name != "" {
				name = "Example" + prefixed(ex.Name)
			}
			where := fmt.Sprintf("%s: %s", dir, name)
			if strings.Contains(ex.Doc, "compiled, not run") {
				*notRun = append(*notRun, where)
				continue
			}
			report("%s has no output comment, so go test does not run it (or say \"compiled, not run\" in its doc and why)", where)
		}
	}
	return nil
}

// prefixed returns an example's name as written after "Example".
func prefixed(name string) string {
	if name[0] >= 'a' && name[0] <= 'z' {
		return "_" + name
	}
	return name
}

// checkExported reports the exported declarations of f that have no doc
// comment. A method counts only if its receiver's type is exported; a
// constant, variable or type in a parenthesised group may be documented by
// the group's comment or by its own.
func checkExported(fset *token.FileSet, f *ast.File, report func(string, ...any)) {
	for _, decl := range f.Decls {
		switch d := decl.(type) {
		case *ast.FuncDecl:
			if !d.Name.IsExported() || d.Doc != nil {
				continue
			}
			if d.Recv != nil && !exportedRecv(d.Recv) {
				continue
			}
			report("%s: %s has no doc comment", fset.Position(d.Pos()), funcName(d))
		case *ast.GenDecl:
			if d.Tok == token.IMPORT || d.Doc != nil && d.Lparen.IsValid() {
				continue
			}
			for _, spec := range d.Specs {
				switch s := spec.(type) {
				case *ast.TypeSpec:
					if s.Name.IsExported() && d.Doc == nil && s.Doc == nil && s.Comment == nil {
						report("%s: type %s has no doc comment", fset.Position(s.Pos()), s.Name.Name)
					}
				case *ast.ValueSpec:
					if d.Doc != nil || s.Doc != nil || s.Comment != nil {
						continue
					}
					for _, n := range s.Names {
						if n.IsExported() {
							report("%s: %s %s has no doc comment", fset.Position(n.Pos()), d.Tok, n.Name)
						}
					}
				}
			}
		}
	}
}

// exportedRecv reports whether a method's receiver type is exported.
func exportedRecv(recv *ast.FieldList) bool {
	if len(recv.List) == 0 {
		return false
	}
	t := recv.List[0].Type
	for {
		switch x := t.(type) {
		case *ast.StarExpr:
			t = x.X
		case *ast.IndexExpr:
			t = x.X
		case *ast.IndexListExpr:
			t = x.X
		case *ast.Ident:
			return x.IsExported()
		default:
			return false
		}
	}
}

func funcName(d *ast.FuncDecl) string {
	if d.Recv == nil {
		return "func " + d.Name.Name
	}
	return "method " + d.Name.Name
}
