package gateway

import (
	"path/filepath"
	"testing"

	"github.com/acpgate/acpgate/internal/roomsize"
)

// The rooms of gateway/ stay livable: no type has more than 45 methods and
// no function is longer than 80 lines (from func to its closing brace), in
// gateway/ and every package under it, tests excepted.
func TestRoomSizes(t *testing.T) {
	r, err := roomsize.Check(".", roomsize.Limits{MaxMethods: 45, MaxFuncLines: 80})
	if err != nil {
		t.Fatal(err)
	}
	if r.Methods["Server"] == 0 || r.Methods[filepath.Join("config", "Config")] == 0 {
		t.Fatal("no method of Server or config.Config counted: the walk missed gateway/")
	}
	for _, p := range r.Problems {
		t.Error(p)
	}
}
