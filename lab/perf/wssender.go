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
	// expired closes c when a Send outlives timeout, and stopWatch ends
	// the watch on the bench's ctx that closes c when it is done: c's reads
	// and writes take a ctx that is never done, so that coder/websocket
	// registers no context.AfterFunc per frame (with the per-send
	// context.WithTimeout, about 8 % of the generator's CPU, as perf
	// sampled the lab process in lab bench --transport ws).
	expired   *time.Timer
	stopWatch func() bool
	n         int64
	prefix    string
	buf       []byte
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
// error with the error frame's text. It gives up after the sender's
// timeout, or when ctx is done, by closing the socket (the next Send
// dials again). Every Send of one sender must get the same ctx: the
// socket is watched with the ctx of the Send that dialled it.
func (s *wsSender) Send(ctx context.Context, chatID int64, body string) (string, error) {
	if err := ctx.Err(); err != nil {
		return "", err
	}
	if s.c == nil {
		dctx, cancel := context.WithTimeout(ctx, s.timeout)
		opts := &websocket.DialOptions{Subprotocols: []string{chat.WSProtocol}}
		if s.token != "" {
			opts.Subprotocols = append(opts.Subprotocols, chat.WSBearerPrefix+s.token)
		}
		c, _, err := websocket.Dial(dctx, s.url, opts)
		cancel()
		if err != nil {
			return "", fmt.Errorf("dial: %w", err)
		}
		c.SetReadLimit(1 << 20)
		s.c = c
		s.stopWatch = context.AfterFunc(ctx, func() { _ = c.CloseNow() })
		// A timer per socket: one that fires late for an earlier socket
		// closes that one, not this.
		s.expired = time.AfterFunc(s.timeout, func() { _ = c.CloseNow() })
	} else {
		s.expired.Reset(s.timeout)
	}
	c := s.c
	defer s.expired.Stop()
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
	rctx := context.WithoutCancel(ctx)
	if err := c.Write(rctx, websocket.MessageText, b); err != nil {
		s.drop()
		return "", s.failure(ctx, err)
	}
	for {
		_, data, err := c.Read(rctx)
		if err != nil {
			s.drop()
			return "", s.failure(ctx, err)
		}
		if msgID, ok := scanAck(data, id); ok {
			return msgID, nil
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

// failure names why a socket operation failed: ctx's end, or the
// sender's timeout, which closed the socket under it.
func (s *wsSender) failure(ctx context.Context, err error) error {
	if cerr := ctx.Err(); cerr != nil {
		return cerr
	}
	if !s.expired.Stop() {
		return fmt.Errorf("no ack within %v: %w", s.timeout, context.DeadlineExceeded)
	}
	return err
}

// scanAck reads the ack of the send with client_id id as the server writes
// it (chat.AppendAckFrame: the type, the client_id, then the id; ids and
// the message id need no escapes) and returns its message id. For any
// other frame, or another layout, it returns false and Send decodes the
// frame with encoding/json.
func scanAck(data []byte, id string) (string, bool) {
	rest, ok := bytes.CutPrefix(data, []byte(`{"type":"ack","client_id":"`))
	if !ok {
		return "", false
	}
	if rest, ok = bytes.CutPrefix(rest, []byte(id)); !ok {
		return "", false
	}
	if rest, ok = bytes.CutPrefix(rest, []byte(`","id":"`)); !ok {
		return "", false
	}
	end := bytes.IndexByte(rest, '"')
	if end <= 0 || bytes.IndexByte(rest[:end], '\\') >= 0 {
		return "", false
	}
	return string(rest[:end]), true
}

func (s *wsSender) drop() {
	if s.c != nil {
		_ = s.c.CloseNow()
		s.c = nil
		s.stopWatch()
	}
}

// Close closes the socket.
func (s *wsSender) Close() {
	if s.c != nil {
		_ = s.c.Close(websocket.StatusNormalClosure, "")
		s.c = nil
		s.stopWatch()
	}
}
