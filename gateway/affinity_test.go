package gateway

import (
	"io"
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

// The page learns the affinity cookie's name from the gateway: index.html's
// acpgate-affinity-cookie meta tag says sessions.affinity_cookie (escaped),
// and is empty when none is configured, so that a share link can set that
// cookie and no other (issue #30 item 7).
func TestPageNamesTheAffinityCookie(t *testing.T) {
	for _, tc := range []struct{ name, want string }{
		{"ACPGATE_AFFINITY", `<meta name="acpgate-affinity-cookie" content="ACPGATE_AFFINITY">`},
		{"a'b&c", `<meta name="acpgate-affinity-cookie" content="a&#39;b&amp;c">`},
		{"", `<meta name="acpgate-affinity-cookie" content="">`},
	} {
		ts := startServer(t, func(c *config.Config) { c.Sessions.AffinityCookie = tc.name })
		resp, err := ts.http.Get("http://" + ts.addr + "/")
		if err != nil {
			t.Fatal(err)
		}
		var body strings.Builder
		_, err = io.Copy(&body, resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/html") || resp.Header.Get("Content-Security-Policy") == "" {
			t.Fatalf("GET / with affinity_cookie %q: %d %v %v", tc.name, resp.StatusCode, resp.Header, err)
		}
		if got := strings.Count(body.String(), "acpgate-affinity-cookie"); got != 1 || !strings.Contains(body.String(), tc.want) {
			t.Errorf("GET / with affinity_cookie %q: the page does not say %s (%d meta tags)", tc.name, tc.want, got)
		}
		ts.shutdown()
	}
}
