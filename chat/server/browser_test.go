package server

import (
	"bytes"
	"context"
	"fmt"
	"image"
	"image/color"
	"image/draw"
	"image/png"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/chat/auth"
	"github.com/outboxchat/outboxchat/chat/internal/chattest"
)

// browserWait bounds each wait on the page's DOM. Generous: the machine may
// be a loaded 2-core box running the other packages' tests.
const browserWait = 20 * time.Second

// TestChatPageInBrowser drives the chat page of both services in headless
// Chromium: one tab per service on the same chat, a send from each tab, a
// restart of the workers service mid-conversation (the page must reconnect by
// itself and catch up by seq, each message exactly once), and an over-long
// message whose error shows next to the input while the text stays. It saves
// a screenshot of both tabs side by side and logs its path.
func TestChatPageInBrowser(t *testing.T) {
	t.Parallel()
	chromium := chromiumPath(t)
	h := newHarness(t, "")
	// A fixed address, so the restarted workers service comes back on the
	// URL the page knows.
	workersAddr := freeAddr(t)
	onWorkersAddr := func(c *Config) { c.API.HTTPAddr = workersAddr }
	cons := h.start(chat.Consumers, nil)
	work := h.start(chat.Workers, onWorkersAddr)

	const width, height = 560, 680
	consTab, workTab := startBrowser(t, chromium, width, height, false)
	const chatN = 42
	// Auth is on: each tab is a user whose token is in the URL fragment.
	open := func(tab context.Context, base, user string) {
		t.Helper()
		openPage(t, tab, base, user, strconv.Itoa(chatN), auth.ChatScope{IDs: []int64{chatN}}, width, height)
	}
	open(consTab, cons.base, "alice")
	open(workTab, "http://"+workersAddr, "bob")
	// While its socket is up the page sends on it, not by HTTP: every
	// send below is made with the tab's socket live, so none may POST.
	for _, tab := range []context.Context{consTab, workTab} {
		countPosts(t, tab)
	}

	// One message from each tab; each waits to be in both tabs before the
	// next is sent, so both tabs must show them in that order.
	sendFromPage(t, consTab, "hello from consumers")
	waitMessages(t, consTab, "consumers#1")
	waitMessages(t, workTab, "consumers#1")
	sendFromPage(t, workTab, "hi from workers")
	waitMessages(t, workTab, "consumers#1", "workers#1")
	waitMessages(t, consTab, "consumers#1", "workers#1")

	// Redeploy workers mid-conversation: stop it, send from consumers while
	// it is down, start it again on the same address.
	work.stop()
	waitPage(t, workTab, "the workers page to notice the service is gone (chat.Serve must close its WebSockets when it stops)", `document.getElementById("status").className === "down"`)
	sendFromPage(t, consTab, "sent while workers was down (1)")
	sendFromPage(t, consTab, "sent while workers was down (2)")
	waitMessages(t, consTab, "consumers#1", "workers#1", "consumers#2", "consumers#3")
	h.start(chat.Workers, onWorkersAddr)
	// The page reconnects by itself with its cursors and shows what it
	// missed, each exactly once.
	waitPage(t, workTab, "the workers page to reconnect", `document.getElementById("status").className === "live"`)
	waitMessages(t, workTab, "consumers#1", "workers#1", "consumers#2", "consumers#3")
	sendFromPage(t, workTab, "back after the restart")
	want := []string{"consumers#1", "workers#1", "consumers#2", "consumers#3", "workers#2"}
	waitMessages(t, workTab, want...)
	waitMessages(t, consTab, want...)
	for name, tab := range map[string]context.Context{"consumers tab": consTab, "workers tab": workTab} {
		if n := eval[int](t, tab, `window.testPosts`); n != 0 {
			t.Errorf("%s: %d sends went by HTTP POST with its socket live; want every one on the socket", name, n)
		}
	}

	// Own messages turn from "✓ stored" to "✓✓ delivered <time>" when the
	// other side's receipt comes back (live, over the WebSocket), and to
	// "✓✓ seen <time>" once the other page has shown them; received ones
	// show when this side's inbox stored them.
	for _, tc := range []struct {
		tab  context.Context
		me   string
		name string
	}{{consTab, chat.Consumers, "consumers tab"}, {workTab, chat.Workers, "workers tab"}} {
		waitPage(t, tc.tab, tc.name+": every own message marked delivered",
			`[...document.querySelectorAll("#log .msg.own .mark")].every(e => /^✓✓ (delivered|seen) \d\d:\d\d:\d\d\.\d{3}$/.test(e.textContent))`)
		marks := eval[[]string](t, tc.tab, `[...document.querySelectorAll("#log .msg")].map(e => e.dataset.from + " " + e.querySelector(".mark").textContent)`)
		own := 0
		for _, m := range marks {
			if strings.HasPrefix(m, tc.me+" ") {
				own++
				if !strings.Contains(m, "✓✓ delivered ") && !strings.Contains(m, "✓✓ seen ") {
					t.Errorf("%s: mark %q: want \"✓✓ delivered <time>\" or \"✓✓ seen <time>\" on own messages", tc.name, m)
				}
			} else if !strings.Contains(m, "✓ received ") {
				t.Errorf("%s: mark %q: want \"✓ received <time>\" on the other side's", tc.name, m)
			}
		}
		if own == 0 {
			t.Errorf("%s: no own message to check", tc.name)
		}
		t.Logf("%s marks: %q", tc.name, marks)
	}

	// Each message shows its author, the sender's token's user, on both
	// sides (the received ones carried it in the event).
	for _, tab := range []context.Context{consTab, workTab} {
		authors := eval[[]string](t, tab, `[...document.querySelectorAll("#log .msg")].map(e => e.dataset.from + " " + e.querySelector(".author").textContent)`)
		for _, a := range authors {
			if a != "consumers alice · " && a != "workers bob · " {
				t.Errorf("author shown %q: want alice on consumers' messages, bob on workers'", a)
			}
		}
		if len(authors) != len(want) {
			t.Errorf("%d messages with authors, want %d", len(authors), len(want))
		}
	}

	// An over-long message: the API refuses it, the error shows next to the
	// input, and the text stays in the box to be fixed.
	long := strings.Repeat("x", chat.DefaultMaxBodyBytes+1)
	run(t, workTab, "send an over-long message",
		chromedp.SetValue(chromedp.CSS("#body"), long),
		chromedp.Click(chromedp.CSS("#sendbtn")))
	waitPage(t, workTab, "the error next to the input", `document.getElementById("error").textContent.includes("over the limit")`)
	if got := eval[string](t, workTab, `document.getElementById("body").value`); got != long {
		t.Errorf("after the refused send the input holds %d bytes, want the %d sent", len(got), len(long))
	}
	t.Logf("workers page error: %s", eval[string](t, workTab, `document.getElementById("error").textContent`))
	waitMessages(t, workTab, want...) // nothing was added

	saveScreenshot(t, consTab, workTab)
}

// startBrowser starts headless Chromium (the binary chromium) in a window
// of width×height with the flags every test needs plus extra, and returns
// its first tab and a second one: another tab of the same window, or with
// newWindow a window of its own (so that both count as visible). Both are
// open until the test ends.
func startBrowser(t *testing.T, chromium string, width, height int, newWindow bool, extra ...chromedp.ExecAllocatorOption) (first, second context.Context) {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromium),
		chromedp.UserDataDir(t.TempDir()),
		// Headless, no-first-run, disable-background-networking and
		// disable-sync are in the defaults; these are the rest of the
		// required flags.
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-quic", true),
		chromedp.WindowSize(width, height),
	)
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), append(opts, extra...)...)
	t.Cleanup(cancelAlloc)
	first, cancelFirst := chromedp.NewContext(allocCtx, chromedp.WithLogf(t.Logf))
	t.Cleanup(cancelFirst)
	// The first Run starts the browser; its context must have no deadline.
	if err := chromedp.Do(first); err != nil {
		t.Fatalf("start chromium %s: %v", chromium, err)
	}
	var secondOpts []chromedp.ContextOption
	if newWindow {
		secondOpts = append(secondOpts, chromedp.WithNewBrowserContext())
	}
	second, cancelSecond := chromedp.NewContext(first, secondOpts...)
	t.Cleanup(cancelSecond)
	// Likewise the first Run on a tab opens it for the life of its context.
	if err := chromedp.Do(second); err != nil {
		t.Fatalf("open a second tab: %v", err)
	}
	return first, second
}

// openPage opens the chat page of base on chatID in tab, as user with a
// token for scope (auth is on: the token goes in the URL fragment), in a
// width×height viewport, and waits until the page is live.
func openPage(t *testing.T, tab context.Context, base, user, chatID string, scope auth.ChatScope, width, height int) {
	t.Helper()
	tok, err := auth.MintToken(chattest.Secret, user, []string{chat.Consumers, chat.Workers}, scope, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	run(t, tab, "open "+base,
		chromedp.EmulateViewport(int64(width), int64(height)),
		chromedp.Navigate(fmt.Sprintf("%s/?chat_id=%s#token=%s", base, chatID, tok)))
	waitPage(t, tab, "the page to go live", `document.getElementById("status").className === "live"`)
}

// chromiumPath finds Debian's chromium (or another Chrome) or fails: the
// browser test must not silently skip.
func chromiumPath(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Fatal("chromium not found: run scripts/install-deps.sh --browser (or make deps) to install it")
	return ""
}

// freeAddr returns a 127.0.0.1 address with a port free right now.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	if err := ln.Close(); err != nil {
		t.Fatal(err)
	}
	return addr
}

// run runs actions on tab, bounded by browserWait.
func run(t *testing.T, tab context.Context, what string, actions ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	ctx, cancel := context.WithTimeout(tab, browserWait)
	defer cancel()
	if err := chromedp.Do(ctx, actions...); err != nil {
		t.Fatalf("%s: %v; page: %s", what, err, pageState(tab))
	}
}

// eval evaluates a JavaScript expression on tab.
func eval[T any](t *testing.T, tab context.Context, expr string) T {
	t.Helper()
	ctx, cancel := context.WithTimeout(tab, browserWait)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](expr))
	if err != nil {
		t.Fatalf("evaluate %s: %v", expr, err)
	}
	return v
}

// waitPage polls the predicate expr in the page until it is true, failing
// after browserWait with the page's state.
func waitPage(t *testing.T, tab context.Context, what, expr string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(tab, browserWait+5*time.Second)
	defer cancel()
	// Interval polling, not requestAnimationFrame: a tab that is not in
	// front may get no animation frames.
	_, err := chromedp.Run(ctx, chromedp.Poll[chromedp.Void](expr,
		chromedp.WithPollingInterval(20*time.Millisecond), chromedp.WithPollingTimeout(browserWait)))
	if err != nil {
		t.Fatalf("waiting for %s: %v; page: %s", what, err, pageState(tab))
	}
}

const listMessages = `[...document.querySelectorAll("#log .msg")].map(e => e.dataset.from + "#" + e.dataset.seq)`

// waitMessages waits until the page shows exactly want (side#seq, in DOM
// order): a duplicate, a gap or a different order fails once the deadline
// passes.
func waitMessages(t *testing.T, tab context.Context, want ...string) {
	t.Helper()
	expr := listMessages + `.join(",") === ` + chattest.JSONString(strings.Join(want, ","))
	ctx, cancel := context.WithTimeout(tab, browserWait+5*time.Second)
	defer cancel()
	_, err := chromedp.Run(ctx, chromedp.Poll[chromedp.Void](expr,
		chromedp.WithPollingInterval(20*time.Millisecond), chromedp.WithPollingTimeout(browserWait)))
	if err != nil {
		got := eval[[]string](t, tab, listMessages)
		t.Fatalf("page shows %v, want %v (each once, in order): %v; page: %s", got, want, err, pageState(tab))
	}
	// The rows of one side are also exactly the distinct seqs 1..n.
	got := eval[[]string](t, tab, listMessages)
	if !slices.Equal(got, want) {
		t.Fatalf("page shows %v, want %v", got, want)
	}
}

// sendFromPage types text into the page's input, clicks send, and waits for
// the API's answer (the input cleared, no error).
func sendFromPage(t *testing.T, tab context.Context, text string) {
	t.Helper()
	run(t, tab, "type and send "+text,
		chromedp.SendKeys(chromedp.CSS("#body"), text),
		chromedp.Click(chromedp.CSS("#sendbtn")))
	waitPage(t, tab, "the send of "+text+" to be answered",
		`document.getElementById("body").value === "" && !document.getElementById("sendbtn").disabled || document.getElementById("error").textContent !== ""`)
	if e := eval[string](t, tab, `document.getElementById("error").textContent`); e != "" {
		t.Fatalf("send %q from the page: error %q", text, e)
	}
}

// countPosts makes the page count its HTTP sends (window.testPosts: POSTs
// to a chat's messages), the way a send goes when not on the socket. A reload resets it.
func countPosts(t *testing.T, tab context.Context) {
	t.Helper()
	eval[bool](t, tab, `(() => {
		window.testPosts = 0;
		const f = window.fetch;
		window.fetch = (url, init) => {
			if (init && init.method === "POST" && String(url).endsWith("/messages")) window.testPosts++;
			return f(url, init);
		};
		return true;
	})()`)
}

// pageState describes the page for failure messages.
func pageState(tab context.Context) string {
	ctx, cancel := context.WithTimeout(tab, 5*time.Second)
	defer cancel()
	s, err := chromedp.Run(ctx, chromedp.Evaluate[string](`"status=" + document.getElementById("status").textContent +
		" error=" + JSON.stringify(document.getElementById("error").textContent) +
		" messages=" + `+listMessages+`.join(",")`))
	if err != nil {
		return "(unreadable: " + err.Error() + ")"
	}
	return s
}

// saveScreenshot saves the two tabs' viewports side by side as one PNG under
// $OUTBOXCHAT_ARTIFACTS (or the test's temp directory, removed with it) and logs its path.
func saveScreenshot(t *testing.T, left, right context.Context) {
	t.Helper()
	saveScreenshotAs(t, "outboxchat-chat-page.png", left, right)
}

// saveScreenshotAs is saveScreenshot under file name name.
func saveScreenshotAs(t *testing.T, name string, left, right context.Context) {
	t.Helper()
	var shots []image.Image
	for _, tab := range []context.Context{left, right} {
		ctx, cancel := context.WithTimeout(tab, browserWait)
		b, err := chromedp.Run(ctx, chromedp.CaptureScreenshot())
		cancel()
		if err != nil {
			t.Fatalf("screenshot: %v", err)
		}
		img, err := png.Decode(bytes.NewReader(b))
		if err != nil {
			t.Fatalf("decode screenshot: %v", err)
		}
		shots = append(shots, img)
	}
	const gap = 8
	l, r := shots[0].Bounds(), shots[1].Bounds()
	out := image.NewRGBA(image.Rect(0, 0, l.Dx()+gap+r.Dx(), max(l.Dy(), r.Dy())))
	draw.Draw(out, out.Bounds(), image.NewUniform(color.RGBA{0x6b, 0x72, 0x80, 0xff}), image.Point{}, draw.Src)
	draw.Draw(out, image.Rect(0, 0, l.Dx(), l.Dy()), shots[0], l.Min, draw.Src)
	draw.Draw(out, image.Rect(l.Dx()+gap, 0, l.Dx()+gap+r.Dx(), r.Dy()), shots[1], r.Min, draw.Src)
	dir := os.Getenv("OUTBOXCHAT_ARTIFACTS")
	if dir == "" {
		dir = t.TempDir() // removed with the test: set OUTBOXCHAT_ARTIFACTS to keep it
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatalf("artifacts dir: %v", err)
	}
	path := filepath.Join(dir, name)
	var buf bytes.Buffer
	if err := png.Encode(&buf, out); err != nil {
		t.Fatalf("encode screenshot: %v", err)
	}
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatalf("save screenshot: %v", err)
	}
	t.Logf("screenshot of both chat pages (consumers left, workers right): %s", path)
}
