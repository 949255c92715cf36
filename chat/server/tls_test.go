package server

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/chat/internal/chattest"
	"github.com/outboxchat/outboxchat/internal/devca"
)

// TestTLSRoundTrip runs both services with --tls-cert/--tls-key from a
// private CA: a message sent over HTTPS reaches a WSS client of the other
// service, a client that does not trust the CA is refused, and plain HTTP
// to the TLS port gets no API answer.
func TestTLSRoundTrip(t *testing.T) {
	t.Parallel()
	ca, err := devca.New()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	certFile, keyFile, err := ca.Issue(dir, "server", "127.0.0.1", "localhost")
	if err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, "")
	withTLS := func(c *Config) { c.API.TLSCertFile, c.API.TLSKeyFile = certFile, keyFile }
	cons := h.start(chat.Consumers, withTLS)
	work := h.start(chat.Workers, withTLS)
	consURL, workURL := "https"+strings.TrimPrefix(cons.base, "http"), "https"+strings.TrimPrefix(work.base, "http")
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: ca.ClientConfig()}, Timeout: 10 * time.Second}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	opts := chattest.WSOpts(chattest.Token())
	opts.HTTPClient = client
	c, _, err := websocket.Dial(ctx, "wss"+strings.TrimPrefix(workURL, "https")+"/ws?chat_id=12", opts)
	if err != nil {
		t.Fatalf("wss dial: %v", err)
	}
	defer c.CloseNow()

	req, _ := http.NewRequest(http.MethodPost, consURL+"/api/chats/12/messages", strings.NewReader(`{"body":"over tls"}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+chattest.Token())
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("https send: %v", err)
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated || resp.TLS == nil {
		t.Fatalf("https send: %d %s", resp.StatusCode, raw)
	}
	_, data, err := c.Read(ctx)
	var m chat.Message
	if err != nil || json.Unmarshal(data, &m) != nil || m.Body != "over tls" || m.From != chat.Consumers {
		t.Fatalf("wss frame %s %v, want the message", data, err)
	}

	// A client without the CA is refused; plain HTTP gets no API answer.
	if _, err := http.Get(consURL + "/healthz"); err == nil {
		t.Error("a client that does not trust the private CA connected")
	}
	plain := &http.Client{Timeout: 5 * time.Second}
	if resp, err := plain.Get(cons.base + "/api/chats/12/messages"); err == nil {
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK || bytes.Contains(body, []byte("over tls")) {
			t.Errorf("plain HTTP to the TLS port answered %d %s", resp.StatusCode, body)
		}
	}
}
