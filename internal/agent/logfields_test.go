package agent

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// TestLogFieldNames: every field the agent's code logs (zerolog's
// Str("name", ...), Int64, Float64, ...) is snake_case, and a duration is
// in seconds with its unit in the name (_s), as the README promises: no
// _ms, _ns or Dur (zerolog's Dur writes milliseconds). On d7dd547 the keep
// list's lines logged waited_ms and failing_ms.
func TestLogFieldNames(t *testing.T) {
	fields := map[string]bool{"Str": true, "Strs": true, "Int": true, "Int64": true, "Uint64": true, "Float64": true,
		"Bool": true, "Time": true, "Dur": true, "Stringer": true, "Interface": true, "Any": true, "Dict": true, "Uint32": true, "Int32": true}
	snake := regexp.MustCompile(`^[a-z][a-z0-9]*(_[a-z0-9]+)*$`)
	root := filepath.Join("..", "..")
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && path != root && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" || d.Name() == "e2e" || d.Name() == "bin") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		f, err := parser.ParseFile(fset, path, src, 0)
		if err != nil {
			return err
		}
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok || len(call.Args) < 2 {
				return true
			}
			sel, ok := call.Fun.(*ast.SelectorExpr)
			if !ok || !fields[sel.Sel.Name] {
				return true
			}
			if x, ok := sel.X.(*ast.Ident); ok && x.Name == "flag" {
				return true // the flag package's Int64("name", ...): not a log field
			}
			lit, ok := call.Args[0].(*ast.BasicLit)
			if !ok || lit.Kind != token.STRING {
				return true
			}
			name, _ := strconv.Unquote(lit.Value)
			switch {
			case !snake.MatchString(name):
				t.Errorf("%s: log field %q is not snake_case", fset.Position(lit.Pos()), name)
			case strings.HasSuffix(name, "_ms") || strings.HasSuffix(name, "_ns") || sel.Sel.Name == "Dur":
				t.Errorf("%s: log field %q: durations are logged in seconds, the unit in the name (_s)", fset.Position(lit.Pos()), name)
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
