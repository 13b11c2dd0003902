// Package roomsize measures the rooms of a source tree: how many methods
// each type has (counted by receiver, in non-test files) and how long each
// function is (from func to its closing brace), so that a test can hold a
// package to the project's sizes (#39: at most 45 methods a type, 80 lines
// a function).
package roomsize

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"maps"
	"path/filepath"
	"slices"
	"strings"
)

// Limits are the sizes a tree must keep.
type Limits struct {
	MaxMethods   int
	MaxFuncLines int
	// Skip names directories (by base name) that are not measured.
	Skip []string
}

// Report is what Check found.
type Report struct {
	// Methods counts the methods of each type, by "dir/Type".
	Methods map[string]int
	// Problems says, one line each, what is over a limit.
	Problems []string
}

// Check measures every non-test Go file under root.
func Check(root string, l Limits) (Report, error) {
	fset := token.NewFileSet()
	r := Report{Methods: map[string]int{}}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && path != root && (d.Name() == "testdata" || slices.Contains(l.Skip, d.Name())) {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		for _, decl := range f.Decls {
			fn, ok := decl.(*ast.FuncDecl)
			if !ok || fn.Body == nil {
				continue
			}
			name := fn.Name.Name
			if fn.Recv != nil && len(fn.Recv.List) == 1 {
				recv := filepath.Join(filepath.Dir(path), receiverName(fn.Recv.List[0].Type))
				r.Methods[recv]++
				name = recv + "." + name
			}
			if n := fset.Position(fn.End()).Line - fset.Position(fn.Pos()).Line + 1; n > l.MaxFuncLines {
				r.Problems = append(r.Problems, fmt.Sprintf("%s: %s has %d lines, over %d", fset.Position(fn.Pos()), name, n, l.MaxFuncLines))
			}
		}
		return nil
	})
	for _, typ := range slices.Sorted(maps.Keys(r.Methods)) {
		if n := r.Methods[typ]; n > l.MaxMethods {
			r.Problems = append(r.Problems, fmt.Sprintf("%s has %d methods, over %d", typ, n, l.MaxMethods))
		}
	}
	return r, err
}

// receiverName is the type a method's receiver names (T of *T, T[P] or
// *T[P, Q]).
func receiverName(x ast.Expr) string {
	for {
		switch e := x.(type) {
		case *ast.StarExpr:
			x = e.X
		case *ast.IndexExpr:
			x = e.X
		case *ast.IndexListExpr:
			x = e.X
		case *ast.ParenExpr:
			x = e.X
		case *ast.Ident:
			return e.Name
		default:
			return fmt.Sprintf("%T", x)
		}
	}
}
