package main

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestUpPrintsTokenAndAuthIsOn runs `lab up` and checks its contract: the
// token line, the page URLs carrying the token in the fragment, and
// services that refuse requests without it and accept them with it.
func TestUpPrintsTokenAndAuthIsOn(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() { done <- runLabUp(ctx, nil, pw, io.Discard); pw.Close() }()
	defer func() {
		cancel()
		go io.Copy(io.Discard, pr) //nolint:errcheck // drain until runUp returns
		if err := <-done; err != nil {
			t.Errorf("lab up: %v", err)
		}
	}()
	lines := map[string]string{}
	sc := bufio.NewScanner(pr)
	timer := time.AfterFunc(90*time.Second, func() { pr.CloseWithError(io.ErrUnexpectedEOF) })
	defer timer.Stop()
	for sc.Scan() {
		k, v, _ := strings.Cut(sc.Text(), ": ")
		lines[k] = v
		if k == "workers page" {
			break
		}
	}
	tok := lines["token"]
	if strings.Count(tok, ".") != 2 {
		t.Fatalf("no token line: %q", lines)
	}
	for _, k := range []string{"consumers", "workers"} {
		if want := lines[k] + "/?chat_id=1#token=" + tok; lines[k+" page"] != want {
			t.Errorf("%s page: %q, want %q", k, lines[k+" page"], want)
		}
	}
	post := func(token string) int {
		req, _ := http.NewRequest(http.MethodPost, lines["consumers"]+"/api/chats/1/messages", strings.NewReader(`{"body":"hi"}`))
		req.Header.Set("Content-Type", "application/json")
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := post(""); code != http.StatusUnauthorized {
		t.Errorf("without the token: %d, want 401", code)
	}
	if code := post(tok); code != http.StatusCreated {
		t.Errorf("with the token: %d, want 201", code)
	}
}
