// Package web is acpgate's browser client, embedded in the binary and
// served at /. It is plain ES modules: no build step, no CDN.
package web

import (
	"bytes"
	"embed"
	"html"
	"io/fs"
	"net/http"
	"time"
)

//go:embed static
var files embed.FS

// affinityMeta is index.html's placeholder for the affinity cookie's name.
var affinityMeta = []byte(`<meta name="acpgate-affinity-cookie" content="">`)

// Handler serves the client. Every response forbids framing and inline
// script injection (the page loads only its own modules). The page
// (index.html) names the gateway's affinity cookie in its
// acpgate-affinity-cookie meta tag, affinityCookie() at each request ("" =
// none, and a nil affinityCookie too): a share link may set that cookie and
// no other.
func Handler(affinityCookie func() string) http.Handler {
	sub, err := fs.Sub(files, "static")
	if err != nil {
		panic(err) // the embedded tree always has static/
	}
	index, err := fs.ReadFile(sub, "index.html")
	if err != nil || !bytes.Contains(index, affinityMeta) {
		panic("web: index.html has no acpgate-affinity-cookie meta tag")
	}
	fileServer := http.FileServerFS(sub)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", "default-src 'self'; connect-src 'self' ws: wss:; img-src 'self' data:; style-src 'self'; script-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("Cache-Control", "no-cache")
		if r.URL.Path != "/" {
			fileServer.ServeHTTP(w, r) // /index.html redirects to /
			return
		}
		page := index
		if affinityCookie != nil {
			if name := affinityCookie(); name != "" {
				tag := `<meta name="acpgate-affinity-cookie" content="` + html.EscapeString(name) + `">`
				page = bytes.Replace(index, affinityMeta, []byte(tag), 1)
			}
		}
		http.ServeContent(w, r, "index.html", time.Time{}, bytes.NewReader(page))
	})
}
