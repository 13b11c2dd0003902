package gateway

import (
	"net/http"
	"strings"
	"testing"

	"github.com/acpgate/acpgate/gateway/config"
)

// With sessions.affinity_cookie set, the initialize result names the
// balancer's affinity cookie the opening request carried (for share links),
// and the initialize result offers session/attach; without the cookie, no
// affinity is said.
func TestInitializeSaysTheAffinityCookie(t *testing.T) {
	ts := startServer(t, func(c *config.Config) { c.Sessions.AffinityCookie = "ACPGATE_AFFINITY" })
	c := &httpClient{t: t, ts: ts, hc: &http.Client{}}
	resp, body := c.do(http.MethodPost, map[string]string{"Content-Type": "application/json", "Cookie": "ACPGATE_AFFINITY=replica-b; other=1"}, httpInit)
	if resp.StatusCode != 200 {
		t.Fatalf("initialize: %d %s", resp.StatusCode, body)
	}
	if !strings.Contains(body, `"affinity":"ACPGATE_AFFINITY=replica-b"`) {
		t.Errorf("initialize result %s does not name the affinity cookie", body)
	}
	if !strings.Contains(body, `"sessionCapabilities":{"attach":{}`) && !strings.Contains(body, `"attach":{}`) {
		t.Errorf("initialize result %s does not offer session/attach", body)
	}
	resp, body = c.do(http.MethodPost, map[string]string{"Content-Type": "application/json"}, httpInit)
	if resp.StatusCode != 200 || strings.Contains(body, `"affinity"`) {
		t.Errorf("initialize without the cookie: %d %s", resp.StatusCode, body)
	}
}
