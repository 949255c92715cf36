package httpapi

import (
	_ "embed"
	"net/http"
)

// openAPIDoc is the OpenAPI 3.0 description of a service's HTTP API
// (chat/openapi.json, kept beside the handlers it describes; a test checks
// real requests and answers of a running service against it).
//
//go:embed openapi.json
var openAPIDoc []byte

// OpenAPI returns the OpenAPI 3.0.3 document (JSON) of the HTTP API that
// Serve answers, as served at GET /openapi.json. The slice is a copy; safe
// for concurrent use.
func OpenAPI() []byte { return append([]byte(nil), openAPIDoc...) }

// serveOpenAPI answers GET /openapi.json.
func serveOpenAPI(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "max-age=300")
	_, _ = w.Write(openAPIDoc)
}
