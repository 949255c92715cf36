package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/jackc/pgx/v5"

	"github.com/outboxchat/outboxchat/redisq"
)

// lab up --tls: a message sent over HTTPS reaches a WSS client of the other
// service, with every URL lab up prints trusting only the CA it prints
// (Postgres verify-full, rediss://), and a client without the CA refused.
func TestUpTLSRoundTrip(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	u := startUp(t, "ca", "--tls")
	lines := u.lines
	if lines["ca"] == "" {
		t.Fatalf("lab up --tls printed no ca line: %v; stderr:\n%s", lines, u.stderr.String())
	}
	if !strings.HasPrefix(lines["consumers"], "https://") || !strings.HasPrefix(lines["workers"], "https://") ||
		!strings.Contains(lines["database"], "sslmode=verify-full") || !strings.HasPrefix(lines["redis"], "rediss://") {
		t.Fatalf("lab up --tls printed %v", lines)
	}
	pem, err := os.ReadFile(lines["ca"])
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(pem) {
		t.Fatal("no certificate in the printed CA file")
	}
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}}, Timeout: 20 * time.Second}

	// The printed database and redis URLs work as printed.
	cctx, ccancel := context.WithTimeout(ctx, 20*time.Second)
	defer ccancel()
	conn, err := pgx.Connect(cctx, lines["database"])
	if err != nil {
		t.Fatalf("printed database URL: %v", err)
	}
	var ssl bool
	err = conn.QueryRow(cctx, "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()").Scan(&ssl)
	_ = conn.Close(cctx)
	if err != nil || !ssl {
		t.Errorf("printed database URL: ssl %v, %v", ssl, err)
	}
	rc, err := redisq.NewClient(lines["redis"])
	if err != nil {
		t.Fatal(err)
	}
	if err := rc.Ping(cctx).Err(); err != nil {
		t.Errorf("printed redis URL: %v", err)
	}
	rc.Close()

	ws, _, err := websocket.Dial(cctx, "wss"+strings.TrimPrefix(lines["workers"], "https")+"/ws?chat_id=7",
		&websocket.DialOptions{HTTPClient: client, Subprotocols: []string{"outboxchat.v1", "bearer." + lines["token"]}})
	if err != nil {
		t.Fatalf("wss dial: %v", err)
	}
	defer ws.CloseNow()
	req, _ := http.NewRequestWithContext(cctx, http.MethodPost, lines["consumers"]+"/api/chats/7/messages", strings.NewReader(`{"body":"lab over tls"}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+lines["token"])
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("https send: %v", err)
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("https send: %d %s", resp.StatusCode, raw)
	}
	for {
		_, data, err := ws.Read(cctx)
		if err != nil {
			t.Fatalf("wss read: %v", err)
		}
		var m struct{ Body, From string }
		if json.Unmarshal(data, &m) == nil && m.Body == "lab over tls" {
			break
		}
	}
	// A client that does not trust the lab's CA is refused.
	if resp, err := http.Get(lines["consumers"] + "/healthz"); err == nil {
		resp.Body.Close()
		t.Error("a client without the lab's CA connected")
	}
}
