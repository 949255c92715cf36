// Package web serves the chat page: one embedded HTML file (HTML, CSS and JS,
// no build step) that talks to the service's HTTP API and WebSocket.
package web

import (
	_ "embed"
	"net/http"
	"strings"
)

//go:embed index.html
var page string

// Handler serves the chat page at "/" for service (its name is shown in the
// title). Other paths get 404. Safe for concurrent use.
func Handler(service string) http.Handler {
	body := strings.ReplaceAll(page, "{{SERVICE}}", service)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		_, _ = w.Write([]byte(body))
	})
}

// favicon is the page's icon: a speech bubble with two ticks.
const favicon = `<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 32 32">` +
	`<path d="M4 5h24a2 2 0 0 1 2 2v14a2 2 0 0 1-2 2H13l-7 6v-6H4a2 2 0 0 1-2-2V7a2 2 0 0 1 2-2z" fill="#1f2937"/>` +
	`<path d="M8 14l3 3 6-7M14 17l1 0 6-7" stroke="#86efac" stroke-width="2.2" fill="none" stroke-linecap="round"/></svg>`

// Favicon serves the page's icon (SVG) at /favicon.svg and /favicon.ico,
// so a browser's request for it is not a 404. Safe for concurrent use.
func Favicon() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "image/svg+xml")
		w.Header().Set("Cache-Control", "public, max-age=86400")
		_, _ = w.Write([]byte(favicon))
	})
}
