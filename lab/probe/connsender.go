package probe

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/outboxchat/outboxchat/chat"
)

// ConnSender is the bench's closed-loop sender: it posts messages over one
// keep-alive HTTP/1.1 connection with requests it writes itself (as wrk
// does) and reads the responses with net/http's parser. The load generator
// shares the machine's cores with the system it measures, so it should
// spend as little CPU per message as it can: no per-connection read and
// write goroutines, no header maps. Against an http.Client it
// cuts the lab process's CPU per message (senders and watchers together) by
// about a third. Not safe for concurrent use: one per sender goroutine.
type ConnSender struct {
	host    string // host:port of the service
	auth    string // "Authorization: Bearer <token>\r\n", or "" without a token
	timeout time.Duration
	conn    net.Conn
	br      *bufio.Reader
	req     []byte // reused request buffer
}

// NewConnSender returns a sender to baseURL ("http://host:port") offering
// token ("" = none), each request bounded by timeout; it dials on first use
// and again after any error.
func NewConnSender(baseURL, token string, timeout time.Duration) (*ConnSender, error) {
	u, err := url.Parse(baseURL)
	if err != nil || u.Scheme != "http" || u.Host == "" {
		return nil, fmt.Errorf("lab: sender: base URL %q is not http://host:port", baseURL)
	}
	s := &ConnSender{host: u.Host, timeout: timeout}
	if token != "" {
		s.auth = "Authorization: Bearer " + token + "\r\n"
	}
	return s, nil
}

// Send posts body to chat chatID and returns the stored message's id on
// 201, else an error naming the status and the API's error text. Any
// transport error closes the connection (the next send redials).
func (s *ConnSender) Send(ctx context.Context, chatID int64, body string) (string, error) {
	id, err := s.roundTrip(ctx, chatID, body)
	if err != nil && s.conn != nil && !errors.Is(err, errStatus) {
		_ = s.conn.Close()
		s.conn = nil
	}
	return id, err
}

// errStatus marks an HTTP answer other than 201 (the connection stays).
var errStatus = errors.New("status")

func (s *ConnSender) roundTrip(ctx context.Context, chatID int64, body string) (string, error) {
	if s.conn == nil {
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp", s.host)
		if err != nil {
			return "", err
		}
		s.conn, s.br = c, bufio.NewReaderSize(c, 4096)
	}
	deadline := time.Now().Add(s.timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	if err := s.conn.SetDeadline(deadline); err != nil {
		return "", err
	}
	payload, err := json.Marshal(chat.SendRequest{Body: body})
	if err != nil {
		return "", err
	}
	b := s.req[:0]
	b = append(b, "POST /api/chats/"...)
	b = strconv.AppendInt(b, chatID, 10)
	b = append(b, "/messages HTTP/1.1\r\nHost: "...)
	b = append(b, s.host...)
	b = append(b, "\r\n"...)
	b = append(b, s.auth...)
	b = append(b, "Content-Type: application/json\r\nContent-Length: "...)
	b = strconv.AppendInt(b, int64(len(payload)), 10)
	b = append(b, "\r\n\r\n"...)
	b = append(b, payload...)
	s.req = b
	if _, err := s.conn.Write(b); err != nil {
		return "", err
	}
	resp, err := http.ReadResponse(s.br, nil)
	if err != nil {
		return "", err
	}
	data, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	resp.Body.Close()
	if err != nil {
		return "", err
	}
	if resp.Close {
		_ = s.conn.Close()
		s.conn = nil
	}
	if resp.StatusCode != http.StatusCreated {
		var e struct {
			Error string `json:"error"`
		}
		_ = json.Unmarshal(data, &e)
		return "", fmt.Errorf("%w %d %s", errStatus, resp.StatusCode, e.Error)
	}
	var m struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal(data, &m); err != nil || m.ID == "" {
		return "", fmt.Errorf("decode reply %q: %v", data, err)
	}
	return m.ID, nil
}

// Close closes the connection, if any.
func (s *ConnSender) Close() {
	if s.conn != nil {
		_ = s.conn.Close()
		s.conn = nil
	}
}
