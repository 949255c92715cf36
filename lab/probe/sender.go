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
	req, err := http.NewRequestWithContext(ctx, http.MethodPost,
		baseURL+"/api/chats/"+strconv.FormatInt(chatID, 10)+"/messages", bytes.NewReader(b))
	if err != nil {
		return m, err
	}
	req.Header.Set("Content-Type", "application/json")
	if s.token != "" {
		req.Header.Set("Authorization", "Bearer "+s.token)
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return m, err
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode != http.StatusCreated {
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
