package httpapi

import "github.com/outboxchat/outboxchat/chat/httpapi/internal/openapi"

// OpenAPI returns the OpenAPI 3.0.3 document (JSON) of the HTTP API that
// Serve answers, as served at GET /openapi.json. The slice is a copy; safe
// for concurrent use.
func OpenAPI() []byte { return append([]byte(nil), openapi.Doc...) }
