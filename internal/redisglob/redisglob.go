// Package redisglob writes the Redis glob patterns of ACL key rules that
// match given key names: a name's glob characters * ? [ ] and \ are
// escaped with \.
package redisglob

import "strings"

// KeyRule returns the ACL key rule ("~pattern") matching key name k: k's
// glob characters escaped, except a final "*", which stays a wildcard (k
// "p:q:{a}:dedupe*" matches every key starting "p:q:{a}:dedupe").
func KeyRule(k string) string {
	if rest, star := strings.CutSuffix(k, "*"); star {
		return "~" + Escape(rest) + "*"
	}
	return "~" + Escape(k)
}

// Escape returns s with its glob characters * ? [ ] and \ escaped with \,
// a pattern that matches s alone (a key rule's or a channel rule's).
func Escape(s string) string {
	var b strings.Builder
	for _, r := range s {
		if strings.ContainsRune(`*?[]\`, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}
