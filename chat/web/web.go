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
