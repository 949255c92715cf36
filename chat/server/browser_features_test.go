package server

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/chat/auth"
)

// bulkBoth stores n old messages of each side in chat chatID (a decimal
// string: above 2^53 too), consistently on both sides: consumers' by alice
// in consumers.messages and workers.inbox, workers' by bob in
// workers.messages and consumers.inbox, interleaved in time, all delivered
// (receipts on both sides, so nothing is re-driven).
func bulkBoth(t *testing.T, h *harness, chatID string, n int) {
	t.Helper()
	ctx := context.Background()
	for _, q := range []string{
		`INSERT INTO consumers.messages (id, chat_id, seq, body, author, created_at)
			SELECT md5('c' || $1 || ':' || g)::uuid, $1::bigint, g, 'old from alice ' || g, 'alice', now() - interval '1 hour' + (2 * g) * interval '1 s' FROM generate_series(1, $2) g`,
		`INSERT INTO workers.inbox (message_id, chat_id, seq, body, sender, sent_at, author)
			SELECT id, chat_id, seq, body, 'consumers', created_at, author FROM consumers.messages WHERE chat_id = $1::bigint AND seq <= $2`,
		`INSERT INTO workers.messages (id, chat_id, seq, body, author, created_at)
			SELECT md5('w' || $1 || ':' || g)::uuid, $1::bigint, g, 'old from bob ' || g, 'bob', now() - interval '1 hour' + (2 * g + 1) * interval '1 s' FROM generate_series(1, $2) g`,
		`INSERT INTO consumers.inbox (message_id, chat_id, seq, body, sender, sent_at, author)
			SELECT id, chat_id, seq, body, 'workers', created_at, author FROM workers.messages WHERE chat_id = $1::bigint AND seq <= $2`,
		`INSERT INTO consumers.receipts (chat_id, upto_seq, delivered_at) VALUES ($1::bigint, $2, now())`,
		`INSERT INTO workers.receipts (chat_id, upto_seq, delivered_at) VALUES ($1::bigint, $2, now())`,
	} {
		if _, err := h.Admin.Exec(ctx, q, chatID, n); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
}

// TestChatPageFeaturesInBrowser drives two windows, alice's on consumers
// and bob's on workers, on a chat whose id is above 2^53 and which holds
// 120 old messages: each opens at the newest 50 and loads older ones on
// scroll back; a send shows ✓✓ delivered, then seen once bob's page showed
// it; bob's typing shows "typing…" on alice's; both see who is online;
// alice edits and deletes her message and both windows follow; the chat
// list names the chat exactly. Screenshots of both windows at each step go
// to $OUTBOXCHAT_ARTIFACTS (or the test's temp directory).
func TestChatPageFeaturesInBrowser(t *testing.T) {
	t.Parallel()
	chromium := chromiumPath(t)
	h := newHarness(t, "")
	cons := h.start(chat.Consumers, nil)
	work := h.start(chat.Workers, nil)
	const chatID = "9007199254740993" // 2^53 + 1: a float64 would read 2^53
	bulkBoth(t, h, chatID, 60)

	const width, height = 620, 700
	// Two windows (not tabs), so both count as visible; background windows
	// keep their timers.
	aliceTab, bobTab := startBrowser(t, chromium, width, height, true,
		chromedp.Flag("disable-background-timer-throttling", true),
		chromedp.Flag("disable-renderer-backgrounding", true),
		chromedp.Flag("disable-backgrounding-occluded-windows", true))
	open := func(tab context.Context, base, user string) {
		t.Helper()
		openPage(t, tab, base, user, chatID, auth.ChatScope{All: true}, width, height)
	}
	open(aliceTab, cons.base, "alice")
	open(bobTab, work.base, "bob")
	shots := 0
	shot := func(what string) {
		shots++
		saveScreenshotAs(t, fmt.Sprintf("chat-features-%d-%s.png", shots, what), aliceTab, bobTab)
	}

	// The newest 50 of 120, oldest first: sides interleaved, ending with
	// bob's 60th; the count says there are more.
	for name, tab := range map[string]context.Context{"alice": aliceTab, "bob": bobTab} {
		got := eval[[]string](t, tab, listMessages)
		if len(got) != 50 || got[0] != "consumers#36" || got[49] != "workers#60" {
			t.Fatalf("%s's page opened with %d messages, %v … , want consumers#36 … workers#60", name, len(got), got[:min(3, len(got))])
		}
		if c := eval[string](t, tab, `document.getElementById("count").textContent`); !strings.Contains(c, "more above") {
			t.Errorf("%s: count %q", name, c)
		}
		if id := eval[string](t, tab, `new URLSearchParams(location.search).get("chat_id") + "/" + document.getElementById("chat").value`); id != chatID+"/"+chatID {
			t.Errorf("%s: chat id shown as %q, want %s", name, id, chatID)
		}
	}
	shot("opened")

	// Scroll back twice: 100, then all 120, each once, in order.
	for _, want := range []int{100, 120} {
		run(t, aliceTab, "scroll to the top", chromedp.Evaluate[chromedp.Void](`document.getElementById("log").scrollTop = 0; document.getElementById("log").dispatchEvent(new Event("scroll"))`))
		waitPage(t, aliceTab, fmt.Sprintf("%d messages after scrolling back", want), fmt.Sprintf(`%s.length === %d`, listMessages, want))
	}
	got := eval[[]string](t, aliceTab, listMessages)
	for i, m := range got {
		side := []string{"consumers", "workers"}[i%2]
		if m != fmt.Sprintf("%s#%d", side, i/2+1) {
			t.Fatalf("after scrolling back, message %d is %s, want %s#%d", i, m, side, i/2+1)
		}
	}
	if c := eval[string](t, aliceTab, `document.getElementById("count").textContent`); c != "120 messages" {
		t.Errorf("count after the whole history: %q", c)
	}
	shot("scrolled-back")

	// Typing: bob types, alice sees it; presence lists both.
	run(t, bobTab, "type", chromedp.SendKeys(chromedp.CSS("#body"), "hel"))
	waitPage(t, aliceTab, "bob typing on alice's page", `document.getElementById("typing").textContent === "bob (workers) is typing…"`)
	waitPage(t, aliceTab, "presence on alice's page", `document.getElementById("online").textContent === "online: alice (consumers), bob (workers)"`)
	waitPage(t, bobTab, "presence on bob's page", `document.getElementById("online").textContent === "online: alice (consumers), bob (workers)"`)
	shot("typing")
	run(t, bobTab, "clear", chromedp.Evaluate[chromedp.Void](`document.getElementById("body").value = ""`))

	// Back to the newest, then alice sends: delivered, then seen once bob's
	// page has shown it.
	run(t, aliceTab, "scroll to the newest", chromedp.Evaluate[chromedp.Void](`document.getElementById("log").scrollTop = 1e9`))
	sendFromPage(t, aliceTab, "hello bob")
	waitPage(t, bobTab, "alice's message on bob's page", `[...document.querySelectorAll("#log .msg")].some(e => e.dataset.from === "consumers" && e.dataset.seq === "61")`)
	last := `[...document.querySelectorAll("#log .msg.own")].pop().querySelector(".mark").textContent`
	waitPage(t, aliceTab, "✓✓ seen on alice's message", last+`.startsWith("✓✓ seen ")`)
	shot("seen")

	// Alice edits her message; both pages show the new text, "edited".
	lastOwn := `[...document.querySelectorAll("#log .msg.own")].pop()`
	run(t, aliceTab, "edit", chromedp.Evaluate[chromedp.Void](lastOwn+`.querySelector("button.edit").click()`))
	waitPage(t, aliceTab, "the composer in edit mode", `document.getElementById("body").value === "hello bob" && document.getElementById("editing").style.display === "block"`)
	run(t, aliceTab, "save the edit",
		chromedp.Evaluate[chromedp.Void](`document.getElementById("body").value = "hello bob, edited"`),
		chromedp.Click(chromedp.CSS("#sendbtn")))
	msg61 := `[...document.querySelectorAll("#log .msg")].find(e => e.dataset.from === "consumers" && e.dataset.seq === "61")`
	for name, tab := range map[string]context.Context{"alice": aliceTab, "bob": bobTab} {
		waitPage(t, tab, "the edit on "+name+"'s page", msg61+`.querySelector(".text").textContent === "hello bob, edited" && `+msg61+`.querySelector(".edited").textContent.includes("edited")`)
	}
	shot("edited")

	// And deletes it.
	run(t, aliceTab, "delete", chromedp.Evaluate[chromedp.Void](msg61+`.querySelector("button.delete").click()`))
	for name, tab := range map[string]context.Context{"alice": aliceTab, "bob": bobTab} {
		waitPage(t, tab, "the delete on "+name+"'s page", msg61+`.dataset.deleted === "1" && `+msg61+`.querySelector(".text").textContent === "message deleted"`)
	}
	// Bob's page offers no edit or delete on alice's messages.
	if n := eval[int](t, bobTab, `document.querySelectorAll("#log .msg:not(.own) button").length`); n != 0 {
		t.Errorf("bob's page offers %d edit/delete buttons on alice's messages", n)
	}

	// The chat list names the chat exactly.
	waitPage(t, aliceTab, "the chat list", `[...document.querySelectorAll("#chatlist .chat")].some(e => e.dataset.chat === "`+chatID+`")`)
	// The favicon is served.
	run(t, aliceTab, "fetch the favicon", chromedp.Evaluate[chromedp.Void](`fetch("/favicon.ico").then(r => window.__fav = r.status)`))
	waitPage(t, aliceTab, "the favicon's status", `window.__fav === 200`)
	shot("deleted")
}
