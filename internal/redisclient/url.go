package redisclient

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	neturl "net/url"
	"os"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// URL schemes besides go-redis's own.
const (
	// SentinelScheme is a Sentinel-managed primary.
	SentinelScheme = "redis+sentinel"
	// ClusterScheme is a Redis Cluster over plain TCP.
	ClusterScheme = "redis+cluster"
	// ClusterTLSScheme is a Redis Cluster over TLS.
	ClusterTLSScheme = "rediss+cluster"
)

// TLSCAFileParam is the URL parameter naming a file of CA certificates
// (PEM) that a TLS server's certificate must chain to, instead of the
// system's roots (the host name is still checked).
const TLSCAFileParam = "tls_ca_file"

// IsSentinel reports whether url is a redis+sentinel:// url (Sentinel).
func IsSentinel(url string) bool { return strings.HasPrefix(url, SentinelScheme+"://") }

// IsCluster reports whether url is a redis+cluster:// or rediss+cluster://
// url (Cluster).
func IsCluster(url string) bool {
	return strings.HasPrefix(url, ClusterScheme+"://") || strings.HasPrefix(url, ClusterTLSScheme+"://")
}

// Single parses a single server's url (redis.ParseURL) and its
// tls_ca_file. Errors: a malformed url, an unreadable or empty
// tls_ca_file, tls_ca_file without rediss://.
func Single(url string) (*redis.Options, error) {
	url, caFile, err := cutQueryParam(url, TLSCAFileParam)
	if err != nil {
		return nil, fmt.Errorf("parsing redis url: %w", err)
	}
	opt, err := redis.ParseURL(url)
	if err != nil {
		return nil, fmt.Errorf("parsing redis url: %w", err)
	}
	if err := setCAFile(opt.TLSConfig, caFile); err != nil {
		return nil, err
	}
	return opt, nil
}

// Sentinel parses
//
//	redis+sentinel://[user:password@]host1:port1[,host2:port2…]/master-name[/db]
//
// into FailoverOptions with SentinelAddrs (port default 26379),
// MasterName, DB (default 0), and Username and Password (the primary's,
// not the sentinels'). Errors: another scheme, no sentinel, no master
// name, a db that is not a non-negative integer.
func Sentinel(url string) (*redis.FailoverOptions, error) {
	rest, ok := strings.CutPrefix(url, SentinelScheme+"://")
	if !ok {
		return nil, fmt.Errorf("sentinel url %q: want %s://host:port[,host:port…]/master[/db]", url, SentinelScheme)
	}
	fo := &redis.FailoverOptions{}
	if at := strings.LastIndex(rest, "@"); at >= 0 {
		user, pass, _ := strings.Cut(rest[:at], ":")
		fo.Username, fo.Password = user, pass
		rest = rest[at+1:]
	}
	hosts, path, _ := strings.Cut(rest, "/")
	for _, h := range strings.Split(hosts, ",") {
		if h == "" {
			continue
		}
		if !strings.Contains(h, ":") {
			h += ":26379"
		}
		fo.SentinelAddrs = append(fo.SentinelAddrs, h)
	}
	if len(fo.SentinelAddrs) == 0 {
		return nil, fmt.Errorf("sentinel url %q: no sentinel address", url)
	}
	master, db, _ := strings.Cut(path, "/")
	if master == "" {
		return nil, fmt.Errorf("sentinel url %q: no master name (…/mymaster/0)", url)
	}
	fo.MasterName = master
	if db != "" {
		n, err := strconv.Atoi(db)
		if err != nil || n < 0 {
			return nil, fmt.Errorf("sentinel url %q: db %q is not a non-negative integer", url, db)
		}
		fo.DB = n
	}
	return fo, nil
}

// Cluster parses
//
//	redis+cluster://[user:password@]host1:port1[,host2:port2…][/][?param=value&…]
//	rediss+cluster://… (TLS)
//
// into ClusterOptions: Addrs (port default 6379), the user and password of
// every node, go-redis's cluster URL parameters (redis.ParseClusterURL)
// and tls_ca_file (rediss+cluster:// only). Errors: another scheme, no
// address, a path other than "", "/" or "/0" (a cluster has database 0
// only), an unknown parameter, an unreadable tls_ca_file; they show the
// url without its password (Redact).
func Cluster(url string) (*redis.ClusterOptions, error) {
	bad := func(why string, args ...any) error {
		return fmt.Errorf("cluster url %q: %s", Redact(url), fmt.Sprintf(why, args...))
	}
	scheme, rest, ok := strings.Cut(url, "://")
	if !ok || (scheme != ClusterScheme && scheme != ClusterTLSScheme) {
		return nil, bad("want %s://host:port[,host:port…]/", ClusterScheme)
	}
	rest, query, _ := strings.Cut(rest, "?")
	var user string
	if at := strings.LastIndex(rest, "@"); at >= 0 {
		user, rest = rest[:at+1], rest[at+1:]
	}
	hosts, path, _ := strings.Cut(rest, "/")
	if path != "" && path != "0" {
		return nil, bad("a cluster has database 0 only, not %q", path)
	}
	var addrs []string
	for _, h := range strings.Split(hosts, ",") {
		if h == "" {
			continue
		}
		if _, _, err := net.SplitHostPort(h); err != nil {
			h = net.JoinHostPort(strings.Trim(h, "[]"), "6379")
		}
		addrs = append(addrs, h)
	}
	if len(addrs) == 0 {
		return nil, bad("no node address")
	}
	q, err := neturl.ParseQuery(query)
	if err != nil {
		return nil, bad("%v", err)
	}
	caFile := q.Get(TLSCAFileParam)
	q.Del(TLSCAFileParam)
	for _, a := range addrs[1:] {
		q.Add("addr", a)
	}
	plain := "redis"
	if scheme == ClusterTLSScheme {
		plain = "rediss"
	}
	opt, err := redis.ParseClusterURL(plain + "://" + user + addrs[0] + "?" + q.Encode())
	if err != nil {
		return nil, bad("%v", err)
	}
	if caFile != "" && opt.TLSConfig == nil {
		return nil, bad("%s needs %s://", TLSCAFileParam, ClusterTLSScheme)
	}
	if err := setCAFile(opt.TLSConfig, caFile); err != nil {
		return nil, err
	}
	return opt, nil
}

// Redact returns url with the password of a user:password@ part replaced
// by "xxxxx", for errors and logs.
func Redact(url string) string {
	scheme, rest, ok := strings.Cut(url, "://")
	if !ok {
		return url
	}
	at := strings.LastIndex(rest, "@")
	if at < 0 {
		return url
	}
	user, _, hasPass := strings.Cut(rest[:at], ":")
	if !hasPass {
		return url
	}
	return scheme + "://" + user + ":xxxxx@" + rest[at+1:]
}

// setCAFile makes cfg (a TLS client's config, nil without TLS) trust only
// the CA certificates in caFile; "" leaves cfg alone.
func setCAFile(cfg *tls.Config, caFile string) error {
	if caFile == "" {
		return nil
	}
	if cfg == nil {
		return fmt.Errorf("%s needs a rediss:// url", TLSCAFileParam)
	}
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return fmt.Errorf("%s: %w", TLSCAFileParam, err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(pem) {
		return fmt.Errorf("%s %s: no PEM certificate in it", TLSCAFileParam, caFile)
	}
	cfg.RootCAs = roots
	return nil
}

// cutQueryParam returns rawURL without its query parameter name, and the
// parameter's value ("" when absent).
func cutQueryParam(rawURL, name string) (string, string, error) {
	u, err := neturl.Parse(rawURL)
	if err != nil {
		return "", "", err
	}
	q := u.Query()
	if !q.Has(name) {
		return rawURL, "", nil
	}
	v := q.Get(name)
	q.Del(name)
	u.RawQuery = q.Encode()
	return u.String(), v, nil
}
