// Package redisglob writes Redis glob patterns (the patterns of ACL key
// and channel rules, KEYS and SCAN MATCH) that match given names: the
// glob characters * ? [ ] and \ of a name are escaped with \.
package redisglob

import "strings"

// Escape returns s with its glob characters escaped: a pattern matching s
// alone.
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

// KeyRule returns the ACL key rule ("~pattern") matching key name k: k's
// glob characters escaped, except a final "*", which stays a wildcard (k
// "p:q:{a}:dedupe*" matches every key starting "p:q:{a}:dedupe").
func KeyRule(k string) string {
	if rest, ok := strings.CutSuffix(k, "*"); ok {
		return "~" + Escape(rest) + "*"
	}
	return "~" + Escape(k)
}
