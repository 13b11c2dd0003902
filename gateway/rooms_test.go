package gateway

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// The rooms of gateway/ stay livable: no type has more than maxMethods
// methods and no function is longer than maxFuncLines lines (from func to
// its closing brace), in gateway/ and gateway/config, tests excepted.
const (
	maxMethods   = 45
	maxFuncLines = 80
)

func TestRoomSizes(t *testing.T) {
	for _, dir := range []string{".", "config"} {
		fset := token.NewFileSet()
		files, err := filepath.Glob(filepath.Join(dir, "*.go"))
		if err != nil {
			t.Fatal(err)
		}
		methods := map[string]int{}
		parsed := 0
		for _, name := range files {
			if strings.HasSuffix(name, "_test.go") {
				continue
			}
			f, err := parser.ParseFile(fset, name, nil, parser.SkipObjectResolution)
			if err != nil {
				t.Fatal(err)
			}
			parsed++
			for _, d := range f.Decls {
				fd, ok := d.(*ast.FuncDecl)
				if !ok || fd.Body == nil {
					continue
				}
				if fd.Recv != nil && len(fd.Recv.List) == 1 {
					methods[receiverType(fd.Recv.List[0].Type)]++
				}
				from, to := fset.Position(fd.Pos()), fset.Position(fd.End())
				if n := to.Line - from.Line + 1; n > maxFuncLines {
					t.Errorf("%s:%d: %s is %d lines (at most %d)", name, from.Line, funcName(fd), n, maxFuncLines)
				}
			}
		}
		if parsed == 0 {
			t.Fatalf("no Go files in %s", dir)
		}
		for _, typ := range slices.Sorted(maps.Keys(methods)) {
			if n := methods[typ]; n > maxMethods {
				t.Errorf("%s: type %s has %d methods (at most %d)", dir, typ, n, maxMethods)
			}
		}
	}
}

// receiverType is the name of a receiver's type: T for T, *T, T[K] or *T[K].
func receiverType(e ast.Expr) string {
	for {
		switch x := e.(type) {
		case *ast.StarExpr:
			e = x.X
		case *ast.IndexExpr:
			e = x.X
		case *ast.IndexListExpr:
			e = x.X
		case *ast.ParenExpr:
			e = x.X
		case *ast.Ident:
			return x.Name
		default:
			return fmt.Sprintf("%T", e)
		}
	}
}

func funcName(fd *ast.FuncDecl) string {
	if fd.Recv != nil && len(fd.Recv.List) == 1 {
		return receiverType(fd.Recv.List[0].Type) + "." + fd.Name.Name
	}
	return fd.Name.Name
}
