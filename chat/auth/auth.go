package auth

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/rsa"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"os"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/outboxchat/outboxchat/chat"

	"github.com/golang-jwt/jwt/v5"
)

// Config says how Serve authenticates requests: JWT bearer tokens
// signed with HS256 (SecretFile) or RS256/EdDSA (KeysFile, a JWKS), or
// nothing at all (Insecure). Exactly one of the three must be set.
type Config struct {
	// SecretFile holds the HS256 secret: the file's bytes, trailing white
	// space removed, at least 32 bytes (RFC 7518 §3.2: a key at least as
	// long as the hash).
	SecretFile string
	// KeysFile is a JWKS (RFC 7517) of public keys: RSA ("kty":"RSA",
	// RS256) and Ed25519 ("kty":"OKP","crv":"Ed25519", EdDSA). A token
	// names its key by "kid"; a token without kid is checked against the
	// only key when there is one.
	KeysFile string
	// Insecure turns authentication off: anyone who reaches the service
	// reads and writes every chat. Serve logs it loudly.
	Insecure bool
}

// ErrNoAuth is returned by Serve when neither a key nor Insecure is set.
var ErrNoAuth = errors.New("no auth configuration: give --jwt-secret-file or --jwt-keys-file (or --insecure-no-auth for a closed network)")

// TokenClaims are the claims of an outboxchat token (JSON):
//
//	{"sub": "alice", "chats": [1, 2] | "*", "svc": "consumers" | ["consumers", "workers"], "exp": 1767225600}
//
// sub is the user; chats the chat ids the user may read and write, or "*"
// for all; svc the service(s) the token is for; exp (required) the expiry
// in Unix seconds.
type TokenClaims struct {
	jwt.RegisteredClaims
	Chats ChatScope `json:"chats"`
	Svc   Services  `json:"svc"`
}

// ChatScope is the chats claim: a list of chat ids, or all of them ("*").
type ChatScope struct {
	All bool
	IDs []int64
}

// Allows reports whether the scope covers chatID.
func (s ChatScope) Allows(chatID int64) bool { return s.All || slices.Contains(s.IDs, chatID) }

// MarshalJSON encodes "*" or the list of ids.
func (s ChatScope) MarshalJSON() ([]byte, error) {
	if s.All {
		return []byte(`"*"`), nil
	}
	if s.IDs == nil {
		return []byte("[]"), nil
	}
	return json.Marshal(s.IDs)
}

// UnmarshalJSON accepts "*" or a list of positive ids (numbers or decimal
// strings).
func (s *ChatScope) UnmarshalJSON(b []byte) error {
	if bytes.Equal(bytes.TrimSpace(b), []byte(`"*"`)) {
		*s = ChatScope{All: true}
		return nil
	}
	var raw []json.RawMessage
	if err := json.Unmarshal(b, &raw); err != nil {
		return errors.New(`chats: want "*" or a list of chat ids`)
	}
	out := ChatScope{IDs: make([]int64, 0, len(raw))}
	for _, r := range raw {
		id, err := chat.ParseChatID(strings.Trim(string(r), `"`))
		if err != nil {
			return fmt.Errorf("chats: %s is not a chat id", r)
		}
		out.IDs = append(out.IDs, id)
	}
	*s = out
	return nil
}

// ParseChatScope parses "*" or comma-separated chat ids ("1,2").
func ParseChatScope(s string) (ChatScope, error) {
	if strings.TrimSpace(s) == "*" {
		return ChatScope{All: true}, nil
	}
	var out ChatScope
	for _, f := range strings.Split(s, ",") {
		id, err := chat.ParseChatID(strings.TrimSpace(f))
		if err != nil {
			return ChatScope{}, fmt.Errorf("chats: %q is not a chat id", f)
		}
		out.IDs = append(out.IDs, id)
	}
	return out, nil
}

// Services is the svc claim: one service name or a list.
type Services []string

// UnmarshalJSON accepts a string or a list of strings.
func (s *Services) UnmarshalJSON(b []byte) error {
	var one string
	if json.Unmarshal(b, &one) == nil {
		*s = Services{one}
		return nil
	}
	var many []string
	if err := json.Unmarshal(b, &many); err != nil {
		return errors.New("svc: want a service name or a list of them")
	}
	*s = many
	return nil
}

// MarshalJSON encodes one service as a string, several as a list.
func (s Services) MarshalJSON() ([]byte, error) {
	if len(s) == 1 {
		return json.Marshal(s[0])
	}
	return json.Marshal([]string(s))
}

// MintToken signs an HS256 token for user, valid for services and chats
// for ttl from now, with iat (now) and a random jti (32 hex digits), so it
// can be revoked by user or by id (Revocations). For development and the
// lab (`outboxchat token`); in production an identity provider mints
// tokens.
func MintToken(secret []byte, user string, services []string, chats ChatScope, ttl time.Duration) (string, error) {
	if user == "" || len(services) == 0 || ttl <= 0 {
		return "", errors.New("mint token: need a user, a service and a positive ttl")
	}
	for _, s := range services {
		if err := chat.CheckService(s); err != nil {
			return "", err
		}
	}
	now := time.Now()
	c := TokenClaims{
		RegisteredClaims: jwt.RegisteredClaims{Subject: user, IssuedAt: jwt.NewNumericDate(now), ExpiresAt: jwt.NewNumericDate(now.Add(ttl)),
			ID: newTokenID()},
		Chats: chats, Svc: services,
	}
	return jwt.NewWithClaims(jwt.SigningMethodHS256, c).SignedString(secret)
}

// newTokenID returns 16 random bytes in hex.
func newTokenID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// ReadSecretFile reads an HS256 secret (see Config.SecretFile).
func ReadSecretFile(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("jwt secret: %w", err)
	}
	b = bytes.TrimRight(b, " \t\r\n")
	if len(b) < 32 {
		return nil, fmt.Errorf("jwt secret %s: %d bytes, want at least 32", path, len(b))
	}
	return b, nil
}

// Verifier checks bearer tokens for one service. Safe for concurrent use.
type Verifier struct {
	service string
	secret  []byte
	keys    map[string]any // kid → *rsa.PublicKey or ed25519.PublicKey
	parser  *jwt.Parser

	// verified caches the principals of tokens that passed, by the whole
	// token string: a client sends the same token with every request, and
	// parsing and checking it (base64, JSON, HMAC or RSA) cost more than
	// the rest of a send's CPU in the API process (see
	// BenchmarkVerifyToken). Only a byte-identical token hits; exp is still
	// checked on every hit. Emptied when it reaches verifiedCacheSize.
	mu       sync.RWMutex
	verified map[string]*Principal

	// revoked is checked on every Verify, cache hit or not.
	revoked *Revocations
}

// verifiedCacheSize bounds Verifier's cache of verified tokens.
const verifiedCacheSize = 4096

// NewVerifier returns the verifier of cfg for service, or nil and no error
// when cfg.Insecure. Errors: ErrNoAuth, unreadable or invalid key files.
func NewVerifier(service string, cfg Config) (*Verifier, error) {
	set := 0
	for _, b := range []bool{cfg.SecretFile != "", cfg.KeysFile != "", cfg.Insecure} {
		if b {
			set++
		}
	}
	switch {
	case set == 0:
		return nil, ErrNoAuth
	case set > 1:
		return nil, errors.New("auth: give only one of --jwt-secret-file, --jwt-keys-file, --insecure-no-auth")
	case cfg.Insecure:
		return nil, nil
	}
	v := &Verifier{service: service, verified: map[string]*Principal{}, revoked: NewRevocations()}
	var methods []string
	if cfg.SecretFile != "" {
		s, err := ReadSecretFile(cfg.SecretFile)
		if err != nil {
			return nil, err
		}
		v.secret = s
		methods = []string{jwt.SigningMethodHS256.Alg()}
	} else {
		keys, err := readJWKS(cfg.KeysFile)
		if err != nil {
			return nil, err
		}
		v.keys = keys
		methods = []string{jwt.SigningMethodRS256.Alg(), jwt.SigningMethodEdDSA.Alg()}
	}
	v.parser = jwt.NewParser(jwt.WithValidMethods(methods), jwt.WithExpirationRequired())
	return v, nil
}

// Revocations returns the set of revoked users and tokens Verify refuses
// (empty at first; the caller fills it).
func (v *Verifier) Revocations() *Revocations { return v.revoked }

// Verify checks token's signature, expiry, svc claim and revocation
// (Revocations) and returns its principal. Errors say why, without echoing
// the token; a revoked token's wraps ErrRevoked.
func (v *Verifier) Verify(token string) (*Principal, error) {
	v.mu.RLock()
	p := v.verified[token]
	v.mu.RUnlock()
	if p != nil && time.Now().Before(p.Expires) {
		if v.revoked.Revoked(p) {
			return nil, fmt.Errorf("invalid token: %w", ErrRevoked)
		}
		return p, nil
	}
	var c TokenClaims
	if _, err := v.parser.ParseWithClaims(token, &c, v.key); err != nil {
		return nil, fmt.Errorf("invalid token: %w", err)
	}
	if c.Subject == "" {
		return nil, errors.New("invalid token: no sub")
	}
	if !validSubject(c.Subject) {
		return nil, errors.New("invalid token: sub holds a control character or is not valid UTF-8")
	}
	// An iat in the future (beyond the issuer's clock skew) is refused:
	// such a token would outlive a revocation of its user, which refuses
	// the tokens issued until then.
	if c.IssuedAt != nil && c.IssuedAt.After(time.Now().Add(issuedAtSkew)) {
		return nil, errors.New("invalid token: iat is in the future")
	}
	if !slices.Contains(c.Svc, v.service) {
		return nil, fmt.Errorf("invalid token: not for service %s", v.service)
	}
	p = &Principal{User: c.Subject, Chats: c.Chats, Expires: c.ExpiresAt.Time, TokenID: c.ID}
	if c.IssuedAt != nil {
		p.IssuedAt = c.IssuedAt.Time
	}
	v.mu.Lock()
	if len(v.verified) >= verifiedCacheSize {
		clear(v.verified)
	}
	v.verified[token] = p
	v.mu.Unlock()
	if v.revoked.Revoked(p) {
		return nil, fmt.Errorf("invalid token: %w", ErrRevoked)
	}
	return p, nil
}

func (v *Verifier) key(t *jwt.Token) (any, error) {
	if v.secret != nil {
		return v.secret, nil
	}
	kid, _ := t.Header["kid"].(string)
	if kid == "" && len(v.keys) == 1 {
		for _, k := range v.keys {
			return k, nil
		}
	}
	if k, ok := v.keys[kid]; ok {
		return k, nil
	}
	return nil, fmt.Errorf("unknown key id %q", kid)
}

// readJWKS reads the RSA and Ed25519 public keys of a JWKS file.
func readJWKS(path string) (map[string]any, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("jwks: %w", err)
	}
	var set struct {
		Keys []struct {
			Kty, Kid, Crv, N, E, X, Use string
		} `json:"keys"`
	}
	if err := json.Unmarshal(b, &set); err != nil {
		return nil, fmt.Errorf("jwks %s: %w", path, err)
	}
	keys := map[string]any{}
	dec := base64.RawURLEncoding
	for i, k := range set.Keys {
		if k.Use != "" && k.Use != "sig" {
			continue
		}
		switch {
		case k.Kty == "RSA":
			n, err1 := dec.DecodeString(k.N)
			e, err2 := dec.DecodeString(k.E)
			if err := errors.Join(err1, err2); err != nil || len(n) < 256 || len(e) == 0 || len(e) > 4 {
				return nil, fmt.Errorf("jwks %s: key %d: bad RSA modulus or exponent (want ≥ 2048 bits)", path, i)
			}
			keys[k.Kid] = &rsa.PublicKey{N: new(big.Int).SetBytes(n), E: int(new(big.Int).SetBytes(e).Int64())}
		case k.Kty == "OKP" && k.Crv == "Ed25519":
			x, err := dec.DecodeString(k.X)
			if err != nil || len(x) != ed25519.PublicKeySize {
				return nil, fmt.Errorf("jwks %s: key %d: bad Ed25519 key", path, i)
			}
			keys[k.Kid] = ed25519.PublicKey(x)
		default:
			return nil, fmt.Errorf("jwks %s: key %d: kty %q crv %q not supported (RSA, OKP/Ed25519)", path, i, k.Kty, k.Crv)
		}
	}
	if len(keys) == 0 {
		return nil, fmt.Errorf("jwks %s: no signing keys", path)
	}
	return keys, nil
}

// principalKey is the context key of the request's *Principal.
type principalKey struct{}

// Principal is who a request acts for: a verified token's subject and what
// it may touch.
type Principal struct {
	// User is the token's sub claim.
	User string
	// Chats are the chats the user may read and write.
	Chats ChatScope
	// Expires is the token's exp.
	Expires time.Time
	// TokenID is the token's jti ("" when it has none); IssuedAt its iat
	// (zero when it has none). Revocations match on them.
	TokenID  string
	IssuedAt time.Time
}

// WithPrincipal returns ctx carrying p.
func WithPrincipal(ctx context.Context, p *Principal) context.Context {
	return context.WithValue(ctx, principalKey{}, p)
}

// PrincipalOf returns the request's principal, or nil when auth is off.
func PrincipalOf(ctx context.Context) *Principal {
	p, _ := ctx.Value(principalKey{}).(*Principal)
	return p
}

// AuthorOf is the author stored with a message sent under ctx: the
// principal's user, or "" when auth is off.
func AuthorOf(ctx context.Context) string {
	if p := PrincipalOf(ctx); p != nil {
		return p.User
	}
	return ""
}

// issuedAtSkew is how far ahead of this process's clock a token's iat may
// be (the issuer's clock running ahead).
const issuedAtSkew = 30 * time.Second

// validSubject reports whether a token's sub can be a user name: valid
// UTF-8 without control characters (a NUL, which Postgres text refuses,
// or a terminal escape, which would reach logs and pages as author).
func validSubject(s string) bool {
	if !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if unicode.IsControl(r) {
			return false
		}
	}
	return true
}
