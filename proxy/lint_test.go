package proxy

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strings"
	"testing"

	"github.com/acpgate/acpgate/internal/roomsize"
)

// No lease is released under a lock (doc.go's lock order): a deferred
// Release registered after a deferred Unlock runs first, with the lock
// still held, in any file of the proxy packages.
func TestNoReleaseDeferredUnderALock(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	more, _ := filepath.Glob("*/*.go")
	fset := token.NewFileSet()
	for _, name := range append(files, more...) {
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			body := funcBody(n)
			if body == nil {
				return true
			}
			unlocked := false
			ast.Inspect(body, func(n ast.Node) bool {
				if _, ok := n.(*ast.FuncLit); ok {
					return false // its defers are its own
				}
				d, ok := n.(*ast.DeferStmt)
				if !ok {
					return true
				}
				switch calledName(d.Call) {
				case "Unlock", "RUnlock":
					unlocked = true
				case "Release":
					if unlocked {
						t.Errorf("%s: a Release deferred after an Unlock runs with the lock held", fset.Position(d.Pos()))
					}
				}
				return true
			})
			return true
		})
	}
}

func funcBody(n ast.Node) *ast.BlockStmt {
	switch f := n.(type) {
	case *ast.FuncDecl:
		return f.Body
	case *ast.FuncLit:
		return f.Body
	}
	return nil
}

func calledName(c *ast.CallExpr) string {
	if sel, ok := c.Fun.(*ast.SelectorExpr); ok {
		return sel.Sel.Name
	}
	return ""
}

// rootFiles parses the proxy root's non-test files.
func rootFiles(t *testing.T) (*token.FileSet, map[string]*ast.File) {
	t.Helper()
	names, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	out := map[string]*ast.File{}
	for _, name := range names {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		out[name] = f
	}
	return fset, out
}

// Only events.go builds an observe.Event (doc.go, "What watches and what
// decides"): routing code says what happened through its functions.
func TestEventsBuiltOnlyInEventsGo(t *testing.T) {
	fset, files := rootFiles(t)
	for name, f := range files {
		if name == "events.go" {
			continue
		}
		ast.Inspect(f, func(n ast.Node) bool {
			lit, ok := n.(*ast.CompositeLit)
			if !ok {
				return true
			}
			if sel, ok := lit.Type.(*ast.SelectorExpr); ok && sel.Sel.Name == "Event" {
				if x, ok := sel.X.(*ast.Ident); ok && x.Name == "observe" {
					t.Errorf("%s: an observe.Event built outside events.go", fset.Position(lit.Pos()))
				}
			}
			return true
		})
	}
}

// The proxy packages' types and functions stay small enough to read: no
// type over maxMethods methods (counted by receiver, in non-test files),
// no function over maxFuncLines lines. proxy/jsonrpc, the scanner, is
// exempt.
const (
	maxMethods   = 45
	maxFuncLines = 80
)

func TestTypesAndFunctionsStaySmall(t *testing.T) {
	r, err := roomsize.Check(".", roomsize.Limits{MaxMethods: maxMethods, MaxFuncLines: maxFuncLines, Skip: []string{"jsonrpc"}})
	if err != nil {
		t.Fatal(err)
	}
	if r.Methods["Session"] == 0 {
		t.Fatal("no method of Session counted: the walk missed the proxy root")
	}
	for _, p := range r.Problems {
		t.Error(p)
	}
}
