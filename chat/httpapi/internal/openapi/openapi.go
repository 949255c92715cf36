// Package openapi holds the OpenAPI 3.0.3 description of a service's HTTP
// API (openapi.json, embedded) and serves it at GET /openapi.json. A test
// of package chat/server checks real requests and answers of a running
// service against it.
package openapi

import (
	_ "embed"
	"net/http"
)

// Doc is the OpenAPI 3.0.3 document (JSON). Callers must not modify it.
//
//go:embed openapi.json
var Doc []byte

// Serve answers GET /openapi.json with Doc (cacheable for 5 min). Safe for
// concurrent use.
func Serve(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "max-age=300")
	_, _ = w.Write(Doc)
}
