package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/legacy"
	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/chat/auth"
	"github.com/outboxchat/outboxchat/chat/httpapi"
	"github.com/outboxchat/outboxchat/chat/internal/chattest"
)

// apiCheck validates real requests to a running service, and its real
// answers, against the OpenAPI document the service serves.
type apiCheck struct {
	t      *testing.T
	router routers.Router
	base   string
}

// The chat page is text/html, which kin-openapi has no body decoder for:
// read it as plain text (its schema is a string).
func init() { openapi3filter.RegisterBodyDecoder("text/html", openapi3filter.PlainBodyDecoder) }

func newAPICheck(t *testing.T, base string) *apiCheck {
	t.Helper()
	resp, err := http.Get(base + "/openapi.json")
	if err != nil {
		t.Fatal(err)
	}
	data, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("GET /openapi.json: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	if !bytes.Equal(data, httpapi.OpenAPI()) {
		t.Fatal("/openapi.json differs from chat/openapi.json")
	}
	doc, err := openapi3.NewLoader().LoadFromData(data)
	if err != nil {
		t.Fatalf("loading the OpenAPI document: %v", err)
	}
	if err := doc.Validate(context.Background()); err != nil {
		t.Fatalf("the OpenAPI document is not valid: %v", err)
	}
	doc.Servers = openapi3.Servers{{URL: base}}
	router, err := legacy.NewRouter(doc)
	if err != nil {
		t.Fatal(err)
	}
	return &apiCheck{t: t, router: router, base: base}
}

// bearerPresent is the checks' AuthenticationFunc: the document's bearer
// scheme is met by an Authorization: Bearer header (the service checks the
// token itself).
func bearerPresent(_ context.Context, in *openapi3filter.AuthenticationInput) error {
	h := in.RequestValidationInput.Request.Header.Get("Authorization")
	if !strings.HasPrefix(h, "Bearer ") {
		return errors.New("no bearer token")
	}
	return nil
}

// do sends req, checks the status is wantCode, then validates the request
// (it must be valid per the document exactly when reqValid) and the answer
// (always: every status, header and body the service gives must be in the
// document).
func (c *apiCheck) do(name string, req *http.Request, body []byte, wantCode int, reqValid bool) []byte {
	c.t.Helper()
	if body != nil {
		req.Body = io.NopCloser(bytes.NewReader(body))
	}
	resp, err := http.DefaultTransport.RoundTrip(req)
	if err != nil {
		c.t.Fatalf("%s: %v", name, err)
	}
	got, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != wantCode {
		c.t.Errorf("%s: status %d, want %d: %s", name, resp.StatusCode, wantCode, got)
	}
	c.validate(name, req, body, resp.StatusCode, resp.Header, got, reqValid)
	return got
}

func (c *apiCheck) validate(name string, req *http.Request, body []byte, code int, header http.Header, got []byte, reqValid bool) {
	c.t.Helper()
	ctx := context.Background()
	if body != nil {
		req.Body = io.NopCloser(bytes.NewReader(body))
	}
	route, params, err := c.router.FindRoute(req)
	if err != nil {
		c.t.Errorf("%s: %s %s is not in the document: %v", name, req.Method, req.URL.Path, err)
		return
	}
	in := &openapi3filter.RequestValidationInput{Request: req, PathParams: params, Route: route,
		Options: &openapi3filter.Options{AuthenticationFunc: bearerPresent, IncludeResponseStatus: true}}
	reqErr := openapi3filter.ValidateRequest(ctx, in)
	switch {
	case reqValid && reqErr != nil:
		c.t.Errorf("%s: the request is invalid per the document: %v", name, reqErr)
	case !reqValid && reqErr == nil:
		c.t.Errorf("%s: the service refused the request (%d) but the document allows it", name, code)
	}
	out := &openapi3filter.ResponseValidationInput{RequestValidationInput: in, Status: code, Header: header,
		Body: io.NopCloser(bytes.NewReader(got)), Options: &openapi3filter.Options{IncludeResponseStatus: true}}
	if err := openapi3filter.ValidateResponse(ctx, out); err != nil {
		c.t.Errorf("%s: the %d answer is invalid per the document: %v\n%s", name, code, err, got)
	}
}

func (c *apiCheck) request(method, path string, header ...string) *http.Request {
	req, err := http.NewRequest(method, c.base+path, nil)
	if err != nil {
		c.t.Fatal(err)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	return req
}

// Real requests to a running service and its real answers — successes and
// errors — validated against the OpenAPI document it serves at
// /openapi.json. Requests the service refuses with 4xx
// must be invalid per the document too, where the document can say so.
func TestOpenAPIDescribesRealTraffic(t *testing.T) {
	t.Parallel()
	h := newHarness(t, "")
	cons := h.start(chat.Consumers, func(c *Config) { c.API.MaxBodyBytes = 64 })
	work := h.start(chat.Workers, nil)
	c := newAPICheck(t, cons.base)
	bearer := "Bearer " + chattest.Token()
	jsonHdr := []string{"Content-Type", "application/json", "Authorization", bearer}

	// Sends: 201, the repeat 200, and the refusals.
	withKey := func(key string) []string { return append([]string{"Idempotency-Key", key}, jsonHdr...) }
	c.do("send", c.request("POST", "/api/chats/7/messages", withKey("k1")...), []byte(`{"body": "hello"}`), 201, true)
	c.do("send again", c.request("POST", "/api/chats/7/messages", withKey("k1")...), []byte(`{"body": "hello"}`), 200, true)
	c.do("key reused", c.request("POST", "/api/chats/7/messages", withKey("k1")...), []byte(`{"body": "other"}`), 409, true)
	c.do("client_id", c.request("POST", "/api/chats/7/messages", jsonHdr...), []byte(`{"body": "two", "client_id": "c2"}`), 201, true)
	c.do("empty body", c.request("POST", "/api/chats/7/messages", jsonHdr...), []byte(`{"body": ""}`), 400, false)
	c.do("unknown field", c.request("POST", "/api/chats/7/messages", jsonHdr...), []byte(`{"body": "x", "extra": 1}`), 400, false)
	c.do("no body field", c.request("POST", "/api/chats/7/messages", jsonHdr...), []byte(`{}`), 400, false)
	c.do("chat id not a number", c.request("POST", "/api/chats/abc/messages", jsonHdr...), []byte(`{"body": "x"}`), 400, false)
	c.do("chat id 0", c.request("POST", "/api/chats/0/messages", jsonHdr...), []byte(`{"body": "x"}`), 400, false)
	c.do("text/plain", c.request("POST", "/api/chats/7/messages", "Content-Type", "text/plain", "Authorization", bearer), []byte(`hello`), 415, false)
	c.do("no token", c.request("POST", "/api/chats/7/messages", "Content-Type", "application/json"), []byte(`{"body": "x"}`), 401, false)
	c.do("body over the limit", c.request("POST", "/api/chats/7/messages", jsonHdr...), []byte(`{"body": "`+strings.Repeat("x", 65)+`"}`), 400, true)
	c.do("request too large", c.request("POST", "/api/chats/7/messages", jsonHdr...), []byte(`{"body": "`+strings.Repeat("x", 64*6+2048)+`"}`), 413, true)
	other, err := auth.MintToken(chattest.Secret, "tester", []string{chat.Consumers, chat.Workers}, auth.ChatScope{IDs: []int64{8}}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	c.do("chat outside the token", c.request("POST", "/api/chats/7/messages", "Content-Type", "application/json", "Authorization", "Bearer "+other), []byte(`{"body": "x"}`), 403, true)

	// History, on both sides: the workers side shows the message received
	// (received_at, delivered_at set), the consumers side its own (delivered_at
	// null until the receipt, then set).
	c.do("history", c.request("GET", "/api/chats/7/messages?after_seq=0&limit=10", "Authorization", bearer), nil, 200, true)
	c.do("history limit 0", c.request("GET", "/api/chats/7/messages?limit=0", "Authorization", bearer), nil, 400, false)
	c.do("history negative cursor", c.request("GET", "/api/chats/7/messages?after_consumers=-1", "Authorization", bearer), nil, 400, false)
	c.do("history no token", c.request("GET", "/api/chats/7/messages", nil...), nil, 401, false)
	w := newAPICheck(t, work.base)
	deadline := time.Now().Add(30 * time.Second)
	for {
		var hist struct {
			Messages []chat.Message `json:"messages"`
		}
		got := w.do("received history", w.request("GET", "/api/chats/7/messages", "Authorization", bearer), nil, 200, true)
		if err := json.Unmarshal(got, &hist); err != nil {
			t.Fatal(err)
		}
		if len(hist.Messages) == 2 && hist.Messages[0].ReceivedAt != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("workers history %s, want the 2 messages received", got)
		}
		time.Sleep(20 * time.Millisecond)
	}

	// The WebSocket: the upgrade (101) and its refusals.
	dctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ws, resp, err := websocket.Dial(dctx, "ws"+strings.TrimPrefix(cons.base, "http")+"/ws?chat_id=7&after_seq=0", chattest.WSOpts(chattest.Token()))
	if err != nil {
		t.Fatal(err)
	}
	ws.Close(websocket.StatusNormalClosure, "")
	c.validate("websocket", c.request("GET", "/ws?chat_id=7&after_seq=0", "Authorization", bearer), nil, resp.StatusCode, resp.Header, nil, true)
	c.do("websocket without upgrade", c.request("GET", "/ws?chat_id=7", "Authorization", bearer), nil, 426, true)
	c.do("websocket bad chat", c.request("GET", "/ws?chat_id=x", "Authorization", bearer), nil, 400, false)
	c.do("websocket no chat", c.request("GET", "/ws", "Authorization", bearer), nil, 400, false)

	// The operational endpoints.
	c.do("healthz", c.request("GET", "/healthz"), nil, 200, true)
	c.do("readyz", c.request("GET", "/readyz"), nil, 200, true)
	c.do("metrics", c.request("GET", "/metrics"), nil, 200, true)
	c.do("openapi", c.request("GET", "/openapi.json"), nil, 200, true)
	c.do("page", c.request("GET", "/"), nil, 200, true)
}
