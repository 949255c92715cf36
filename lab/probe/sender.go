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
	var m chat.Message
	b, _ := json.Marshal(chat.SendRequest{Body: body})
	code, data, err := s.post(ctx, baseURL, chatID, "", b)
	if err != nil {
		return m, err
	}
	if code != http.StatusCreated {
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

// post posts body, a JSON send request, to chat chatID on baseURL with
// Idempotency-Key key ("" = none) and returns the status and the answer
// (its first MiB). The error is the request's: the send's outcome is then
// unknown.
func (s *Sender) post(ctx context.Context, baseURL string, chatID int64, key string, body []byte) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost,
		baseURL+"/api/chats/"+strconv.FormatInt(chatID, 10)+"/messages", bytes.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
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

// Change edits (deleted false: body is the new text) or deletes (deleted
// true) message messageID of chat chatID on baseURL, the message's own
// service. It returns the message at its new version on 200, else an error
// naming the status and the API's error text (a request error leaves the
// outcome unknown).
func (s *Sender) Change(ctx context.Context, baseURL string, chatID int64, messageID, body string, deleted bool) (chat.Message, error) {
	var m chat.Message
	method, payload := http.MethodPatch, []byte(nil)
	if deleted {
		method = http.MethodDelete
	} else {
		payload, _ = json.Marshal(map[string]string{"body": body})
	}
	req, err := http.NewRequestWithContext(ctx, method,
		baseURL+"/api/chats/"+strconv.FormatInt(chatID, 10)+"/messages/"+messageID, bytes.NewReader(payload))
	if err != nil {
		return m, err
	}
	if payload != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if s.token != "" {
		req.Header.Set("Authorization", "Bearer "+s.token)
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return m, err
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode != http.StatusOK {
		var e struct {
			Error string `json:"error"`
		}
		_ = json.Unmarshal(data, &e)
		return m, fmt.Errorf("%d %s", resp.StatusCode, e.Error)
	}
	if err := json.Unmarshal(data, &m); err != nil {
		return m, fmt.Errorf("decode reply: %w", err)
	}
	return m, nil
}
