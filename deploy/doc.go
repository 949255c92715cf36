// Package deploy holds what an operator deploys beside the outboxchat
// services, and the test that keeps it true to them:
//
//   - prometheus/rules.yml: Prometheus alerting rules (backlog
//     age, parked rows, dead letters, relay not listening, relay failing,
//     consumer lag, no deliveries, Redis losing entries, slow end to end,
//     old transactions and xmin horizon, HTTP 5xx), with unit tests in
//     prometheus/rules.test.yml;
//   - grafana/outboxchat.json: a Grafana dashboard of both
//     services (import it and pick the Prometheus data source).
//
// The package has no Go API. Its test runs `promtool check rules` and
// `promtool test rules` (promtool comes with Debian's prometheus package,
// which scripts/install-deps.sh --test installs) and checks that every metric the
// rules and the dashboard use is exported by running `outboxchat serve`
// processes.
package deploy
