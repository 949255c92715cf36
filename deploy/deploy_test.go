package deploy

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/outboxchat/outboxchat/chat"
	"github.com/outboxchat/outboxchat/lab/env"
	"github.com/outboxchat/outboxchat/lab/labtest"
	"github.com/outboxchat/outboxchat/lab/probe"
)

// TestMain builds the outboxchat binary once: the test runs it as the
// services' processes.
func TestMain(m *testing.M) { labtest.Main(m, "deploy-test-") }

const (
	rulesFile     = "prometheus/rules.yml"
	rulesTestFile = "prometheus/rules.test.yml"
	dashboardFile = "grafana/outboxchat.json"
)

// promtool returns the promtool binary, failing the test when it is
// missing (scripts/install-deps.sh --test installs it: `make test` runs that).
func promtool(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatalf("promtool not found (Debian package prometheus; scripts/install-deps.sh --test installs it): %v", err)
	}
	return p
}

func TestPromtoolCheckRules(t *testing.T) {
	t.Parallel()
	out, err := exec.Command(promtool(t), "check", "rules", rulesFile).CombinedOutput()
	if err != nil || !bytes.Contains(out, []byte("SUCCESS")) {
		t.Fatalf("promtool check rules: %v\n%s", err, out)
	}
}

func TestPromtoolTestRules(t *testing.T) {
	t.Parallel()
	cmd := exec.Command(promtool(t), "test", "rules", filepath.Base(rulesTestFile))
	cmd.Dir = filepath.Dir(rulesTestFile)
	out, err := cmd.CombinedOutput()
	if err != nil || !bytes.Contains(out, []byte("SUCCESS")) {
		t.Fatalf("promtool test rules: %v\n%s", err, out)
	}
}

// metricName matches the metric names the rules and the dashboard use:
// ours, and the Go and process collectors'.
var metricName = regexp.MustCompile(`\b(?:outboxchat|go|process)_[a-z0-9_]+\b`)

// usedMetrics returns the metric names in the rules file and in the
// dashboard's targets, each with where it is used.
func usedMetrics(t *testing.T) map[string][]string {
	t.Helper()
	used := map[string][]string{}
	rules, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	// The whole file but its comments: the expressions, and the metrics the
	// annotations point the reader to.
	for line := range strings.Lines(string(rules)) {
		if strings.HasPrefix(strings.TrimSpace(line), "#") {
			continue
		}
		for _, n := range metricName.FindAllString(line, -1) {
			used[n] = append(used[n], rulesFile)
		}
	}
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
		Templating struct {
			List []struct {
				Definition string `json:"definition"`
			} `json:"list"`
		} `json:"templating"`
	}
	data, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &dash); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	targets := 0
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			targets++
			for _, n := range metricName.FindAllString(tg.Expr, -1) {
				used[n] = append(used[n], dashboardFile+": "+p.Title)
			}
		}
	}
	for _, v := range dash.Templating.List {
		for _, n := range metricName.FindAllString(v.Definition, -1) {
			used[n] = append(used[n], dashboardFile+": variable")
		}
	}
	if targets < 15 {
		t.Fatalf("%s: %d targets: the dashboard was not read", dashboardFile, targets)
	}
	return used
}

// families reads a /metrics exposition: family name → type, and the label
// names of its samples.
func families(t *testing.T, text string) (types map[string]string, labels map[string]bool) {
	t.Helper()
	types, labels = map[string]string{}, map[string]bool{}
	labelName := regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)="`)
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if rest, ok := strings.CutPrefix(line, "# TYPE "); ok {
			f := strings.Fields(rest)
			if len(f) == 2 {
				types[f[0]] = f[1]
			}
			continue
		}
		if strings.HasPrefix(line, "#") {
			continue
		}
		if i, j := strings.IndexByte(line, '{'), strings.LastIndexByte(line, '}'); i > 0 && j > i {
			for _, m := range labelName.FindAllStringSubmatch(line[i:j], -1) {
				labels[m[1]] = true
			}
		}
	}
	return types, labels
}

// exists reports whether a name used in a query is exported: a family, or
// a histogram's or summary's _bucket, _sum or _count series.
func exists(types map[string]string, name string) bool {
	if _, ok := types[name]; ok {
		return true
	}
	for _, suf := range []string{"_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(name, suf); ok {
			if typ := types[base]; typ == "histogram" || (typ == "summary" && suf != "_bucket") {
				return true
			}
		}
	}
	return false
}

func get(t *testing.T, url, token string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// Every metric the alert rules and the dashboard use is exported by real
// `outboxchat serve` processes of both services (each running the api,
// relay and worker roles, as the lab runs them) after a little traffic in
// both directions; and no label of theirs carries a chat id or a raw
// path. No allowlist: a metric that is not there fails the test.
func TestRulesAndDashboardUseExportedMetrics(t *testing.T) {
	t.Parallel()
	used := usedMetrics(t)
	if len(used) < 20 {
		t.Fatalf("only %d metric names found in the rules and the dashboard: %v", len(used), used)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	e, err := env.Start(ctx, env.Options{ExtraArgs: env.UnlimitedArgs})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()

	// Traffic: a watcher on each side of chat 1, three messages each way,
	// and requests whose chat id and path must not turn into labels.
	const chatID, n = 1, 3
	var ws []*probe.Watcher
	for _, base := range []string{e.ConsumersURL, e.WorkersURL} {
		w, err := probe.NewWatcher(base, chatID, &probe.WatcherConfig{Token: e.Token})
		if err != nil {
			t.Fatal(err)
		}
		if err := w.Start(ctx); err != nil {
			t.Fatal(err)
		}
		defer w.Stop(context.Background())
		if err := w.WaitConnected(ctx); err != nil {
			t.Fatal(err)
		}
		ws = append(ws, w)
	}
	for i := range n {
		for _, base := range []string{e.ConsumersURL, e.WorkersURL} {
			req, _ := http.NewRequest(http.MethodPost, fmt.Sprintf("%s/api/chats/%d/messages", base, chatID),
				strings.NewReader(fmt.Sprintf(`{"body": "metrics %d"}`, i)))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Authorization", "Bearer "+e.Token)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusCreated {
				t.Fatalf("send to %s: %d", base, resp.StatusCode)
			}
		}
	}
	get(t, e.ConsumersURL+"/api/chats/987654321/messages", e.Token)
	get(t, e.ConsumersURL+"/no/such/path-424242", "")
	deadline := time.Now().Add(time.Minute)
	for len(ws[0].Seen(chat.Workers)) < n || len(ws[1].Seen(chat.Consumers)) < n {
		if time.Now().After(deadline) {
			t.Fatalf("messages not shown within a minute: consumers side saw %d, workers side %d",
				len(ws[0].Seen(chat.Workers)), len(ws[1].Seen(chat.Consumers)))
		}
		time.Sleep(20 * time.Millisecond)
	}

	for _, svc := range []struct{ name, base string }{{chat.Consumers, e.ConsumersURL}, {chat.Workers, e.WorkersURL}} {
		code, text := get(t, svc.base+"/metrics", "")
		if code != http.StatusOK {
			t.Fatalf("%s /metrics: %d", svc.name, code)
		}
		types, labels := families(t, text)
		var missing []string
		for name, where := range used {
			if !exists(types, name) {
				slices.Sort(where)
				missing = append(missing, fmt.Sprintf("%s (used in %s)", name, strings.Join(slices.Compact(where), "; ")))
			}
		}
		slices.Sort(missing)
		for _, m := range missing {
			t.Errorf("%s /metrics has no %s", svc.name, m)
		}
		for _, bad := range []string{"chat_id", "chat", "path", "url", "message_id", "user"} {
			if labels[bad] {
				t.Errorf("%s /metrics has a %q label", svc.name, bad)
			}
		}
		for _, raw := range []string{"987654321", "424242", "/no/such"} {
			if strings.Contains(text, raw) {
				t.Errorf("%s /metrics contains %q from a request path", svc.name, raw)
			}
		}
		if !strings.Contains(text, `{code="201",route="POST /api/chats/{chat_id}/messages"}`) {
			t.Errorf("%s /metrics: sends not counted by route pattern and status", svc.name)
		}
		if svc.name == chat.Consumers && (!strings.Contains(text, `route="GET /api/chats/{chat_id}/messages"`) || !strings.Contains(text, `route="unmatched"`)) {
			t.Errorf("%s /metrics: reads and unmatched paths not counted by route pattern", svc.name)
		}
	}
}
