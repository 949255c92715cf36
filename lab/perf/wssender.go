package perf

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/coder/websocket"

	"github.com/outboxchat/outboxchat/chat"
)

// Bench transports: how the senders send.
const (
	TransportHTTP = "http" // a POST per message on a kept-alive connection
	TransportWS   = "ws"   // a send frame per message on a WebSocket
)

// benchSender sends one message and returns the stored message's id. Not
// safe for concurrent use: each bench sender holds its own.
type benchSender interface {
	Send(ctx context.Context, chatID int64, body string) (string, error)
	Close()
}

// wsSender sends over one WebSocket, opened on its home chat: each Send
// writes a {"type":"send"} frame naming the chat and waits for its ack
// (one in flight: a closed loop, like the HTTP sender), skipping the
// frames the server pushes meanwhile. A failed socket is redialled on the
// next Send. Not safe for concurrent use.
type wsSender struct {
	url, token string
	timeout    time.Duration
	c          *websocket.Conn
	n          int64
	prefix     string
	buf        []byte
}

// newWSSender returns a sender to the service at baseURL (http://host:port)
// holding a socket on chat home, identified by prefix in its client_ids.
func newWSSender(baseURL, token string, home int64, prefix string, timeout time.Duration) (*wsSender, error) {
	rest, ok := strings.CutPrefix(baseURL, "http://")
	if !ok {
		return nil, fmt.Errorf("lab: ws sender: base URL %q is not http://host:port", baseURL)
	}
	return &wsSender{url: "ws://" + rest + "/ws?chat_id=" + strconv.FormatInt(home, 10), token: token, timeout: timeout, prefix: prefix}, nil
}

// Send sends body to chatID and returns the message id of its ack, or an
// error with the error frame's text.
func (s *wsSender) Send(ctx context.Context, chatID int64, body string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	if s.c == nil {
		opts := &websocket.DialOptions{Subprotocols: []string{chat.WSProtocol}}
		if s.token != "" {
			opts.Subprotocols = append(opts.Subprotocols, chat.WSBearerPrefix+s.token)
		}
		c, _, err := websocket.Dial(ctx, s.url, opts)
		if err != nil {
			return "", fmt.Errorf("dial: %w", err)
		}
		c.SetReadLimit(1 << 20)
		s.c = c
	}
	s.n++
	id := s.prefix + strconv.FormatInt(s.n, 10)
	b := append(s.buf[:0], `{"type":"send","client_id":"`...)
	b = append(b, id...)
	b = append(b, `","chat_id":`...)
	b = strconv.AppendInt(b, chatID, 10)
	b = append(b, `,"body":`...)
	b = strconv.AppendQuote(b, body) // bench bodies are ASCII: a JSON string too
	b = append(b, '}')
	s.buf = b
	if err := s.c.Write(ctx, websocket.MessageText, b); err != nil {
		s.drop()
		return "", err
	}
	for {
		_, data, err := s.c.Read(ctx)
		if err != nil {
			s.drop()
			return "", err
		}
		if !bytes.HasPrefix(data, []byte(`{"type":"ack"`)) && !bytes.HasPrefix(data, []byte(`{"type":"error"`)) {
			continue // a pushed message or receipt
		}
		var f chat.AckFrame
		if json.Unmarshal(data, &f) != nil || f.ClientID != id {
			continue
		}
		if f.Type != "ack" {
			return "", errors.New("error frame: " + f.Error)
		}
		return f.ID, nil
	}
}

func (s *wsSender) drop() {
	if s.c != nil {
		_ = s.c.CloseNow()
		s.c = nil
	}
}

// Close closes the socket.
func (s *wsSender) Close() {
	if s.c != nil {
		_ = s.c.Close(websocket.StatusNormalClosure, "")
		s.c = nil
	}
}
