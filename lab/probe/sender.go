package probe

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/outboxchat/outboxchat/chat"
)

// Sender posts messages to a service's HTTP API through an http.Client.
// Safe for concurrent use.
type Sender struct {
	client *http.Client
	token  string // bearer token; "" = none
}

// NewSender returns a Sender that offers token as a bearer token ("" =
// none), with a 5 s timeout per request.
func NewSender(token string) *Sender {
	return &Sender{client: &http.Client{Timeout: 5 * time.Second}, token: token}
}

// Send posts body to chat chatID on baseURL. It returns the stored message
// on 201, else an error naming the status and the API's error text.
func (s *Sender) Send(ctx context.Context, baseURL string, chatID int64, body string) (chat.Message, error) {
	b, _ := json.Marshal(chat.SendRequest{Body: body})
	code, data, err := s.post(ctx, baseURL, chatID, "", b)
	if err != nil {
		return chat.Message{}, err
	}
	return decodeMessage(code, http.StatusCreated, data)
}

// post posts body, a JSON send request, to chat chatID on baseURL with
// Idempotency-Key key ("" = none): see Do.
func (s *Sender) post(ctx context.Context, baseURL string, chatID int64, key string, body []byte) (int, []byte, error) {
	return s.Do(ctx, http.MethodPost, baseURL+"/api/chats/"+strconv.FormatInt(chatID, 10)+"/messages", body, key)
}

// Do sends method to URL u with body (a JSON document; nil: none, and no
// Content-Type), Idempotency-Key key ("" = none) and the Sender's bearer
// token, and returns the status and the answer (its first MiB). The error
// is the request's: the call's outcome is then unknown.
func (s *Sender) Do(ctx context.Context, method, u string, body []byte, key string) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, method, u, bytes.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	if s.token != "" {
		req.Header.Set("Authorization", "Bearer "+s.token)
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, data, nil
}

// CloseIdle closes the Sender's idle kept-alive connections (their
// goroutines end); the Sender stays usable.
func (s *Sender) CloseIdle() { s.client.CloseIdleConnections() }

// decodeMessage returns the message of an answer with status code, or an
// error naming the status and the API's error text unless code is want.
func decodeMessage(code, want int, data []byte) (chat.Message, error) {
	var m chat.Message
	if code != want {
		var e struct {
			Error string `json:"error"`
		}
		_ = json.Unmarshal(data, &e)
		return m, fmt.Errorf("%d %s", code, e.Error)
	}
	if err := json.Unmarshal(data, &m); err != nil {
		return m, fmt.Errorf("decode reply: %w", err)
	}
	return m, nil
}

// Change edits (deleted false: body is the new text) or deletes (deleted
// true) message messageID of chat chatID on baseURL, the message's own
// service. It returns the message at its new version on 200, else an error
// naming the status and the API's error text (a request error leaves the
// outcome unknown).
func (s *Sender) Change(ctx context.Context, baseURL string, chatID int64, messageID, body string, deleted bool) (chat.Message, error) {
	method, payload := http.MethodPatch, []byte(nil)
	if deleted {
		method = http.MethodDelete
	} else {
		payload, _ = json.Marshal(map[string]string{"body": body})
	}
	code, data, err := s.Do(ctx, method, baseURL+"/api/chats/"+strconv.FormatInt(chatID, 10)+"/messages/"+messageID, payload, "")
	if err != nil {
		return chat.Message{}, err
	}
	return decodeMessage(code, http.StatusOK, data)
}
