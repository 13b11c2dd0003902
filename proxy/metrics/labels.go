package metrics

import (
	"strings"
	"sync"

	"github.com/acpgate/acpgate/proxy/acp"
)

// MethodLabel bounds a method name to the known ACP methods.
func MethodLabel(method string) string {
	if _, ok := acp.Methods[method]; ok {
		return method
	}
	if strings.HasPrefix(method, "_") {
		return "_extension"
	}
	return "other"
}

// TenantLabels maps tenant names to label values, naming at most cap of
// them (in order of first use) and folding the rest into "other".
type TenantLabels struct {
	cap   int
	mu    sync.Mutex
	named map[string]string
}

// NewTenantLabels bounds tenant labels to cap values (0 = every tenant is "other").
func NewTenantLabels(cap int) *TenantLabels {
	return &TenantLabels{cap: cap, named: map[string]string{}}
}

// Label returns the label value for tenant ("default" for the anonymous one).
func (t *TenantLabels) Label(tenant string) string {
	if tenant == "" {
		return "default"
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if l, ok := t.named[tenant]; ok {
		return l
	}
	l := "other"
	if len(t.named) < t.cap {
		l = tenant
	}
	t.named[tenant] = l
	return l
}
