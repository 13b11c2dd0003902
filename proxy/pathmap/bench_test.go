package pathmap

import "testing"

var sink string

// toClientCase is one input to a ToClient-like method, on a mapper.
type toClientCase struct {
	name string
	m    *Mapper
	in   string
}

// benchToClient runs f (ToClient or URIToClient) on each case, as a sub-benchmark.
func benchToClient(b *testing.B, f func(*Mapper, string) (string, bool), cases []toClientCase) {
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				sink, _ = f(c.m, c.in)
			}
		})
	}
}

func BenchmarkToClient(b *testing.B) {
	benchToClient(b, (*Mapper).ToClient, []toClientCase{
		{"mapped", newMapper(fuzzRoot, "/workspace"), fuzzRoot + "/src/pkg/main.go"},
		{"identity", newMapper(fuzzRoot, fuzzRoot), fuzzRoot + "/src/pkg/main.go"},
		{"vroot-slash", newMapper(fuzzRoot, "/"), fuzzRoot + "/src/pkg/main.go"},
		{"unclean", newMapper(fuzzRoot, "/workspace"), fuzzRoot + "//src/./pkg/../pkg/main.go"},
		{"outside", newMapper(fuzzRoot, "/workspace"), "/srv/tenants/acme2/secret.txt"},
	})
}

func BenchmarkURIToClient(b *testing.B) {
	benchToClient(b, (*Mapper).URIToClient, []toClientCase{
		{"mapped", newMapper(fuzzRoot, "/workspace"), "file://" + fuzzRoot + "/src/pkg/main.go#L10"},
		{"identity", newMapper(fuzzRoot, fuzzRoot), "file://" + fuzzRoot + "/src/pkg/main.go#L10"},
		{"localhost", newMapper(fuzzRoot, "/workspace"), "file://localhost" + fuzzRoot + "/src/pkg/main.go"},
		{"escaped", newMapper(fuzzRoot, "/workspace"), "file://" + fuzzRoot + "/src/my%20file.go"},
		{"outside", newMapper(fuzzRoot, "/workspace"), "file:///srv/tenants/acme2/secret.txt"},
		{"https", newMapper(fuzzRoot, "/workspace"), "https://example.com/x"},
	})
}

func BenchmarkToAgent(b *testing.B) {
	tr := newTree(b)
	m := mustNew(b, tr.root, "/workspace")
	b.ReportAllocs()
	for b.Loop() {
		sink, _ = m.ToAgent("/workspace/src/main.go")
	}
}

// TestHotPathAllocs pins the hot path's allocation budget: nothing beyond
// the result string, and nothing at all when the result is the input.
func TestHotPathAllocs(t *testing.T) {
	mapped := newMapper(fuzzRoot, "/workspace")
	ident := newMapper(fuzzRoot, fuzzRoot)
	slash := newMapper(fuzzRoot, "/")
	p := fuzzRoot + "/src/pkg/main.go"
	u := "file://" + p + "#L10"
	tests := []struct {
		name string
		max  float64
		f    func()
	}{
		{"ToClient mapped", 1, func() { sink, _ = mapped.ToClient(p) }},
		{"ToClient identity", 0, func() { sink, _ = ident.ToClient(p) }},
		{"ToClient vroot slash", 0, func() { sink, _ = slash.ToClient(p) }},
		{"URIToClient mapped", 1, func() { sink, _ = mapped.URIToClient(u) }},
		{"URIToClient localhost", 1, func() { sink, _ = mapped.URIToClient("file://localhost" + fuzzRoot) }},
		{"URIToClient identity", 0, func() { sink, _ = ident.URIToClient(u) }},
		{"URIToClient vroot slash", 1, func() { sink, _ = slash.URIToClient(u) }},
		{"URIToClient other scheme", 0, func() { sink, _ = mapped.URIToClient("https://example.com/x") }},
	}
	for _, tt := range tests {
		if n := testing.AllocsPerRun(100, tt.f); n > tt.max {
			t.Errorf("%s: %v allocations, want at most %v", tt.name, n, tt.max)
		}
	}
}
