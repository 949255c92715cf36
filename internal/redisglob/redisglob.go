// Package redisglob writes the Redis glob patterns of ACL key rules that
// match given key names: a name's glob characters * ? [ ] and \ are
// escaped with \.
package redisglob

import "strings"

// KeyRule returns the ACL key rule ("~pattern") matching key name k: k's
// glob characters escaped, except a final "*", which stays a wildcard (k
// "p:q:{a}:dedupe*" matches every key starting "p:q:{a}:dedupe").
func KeyRule(k string) string {
	star := strings.HasSuffix(k, "*")
	k = strings.TrimSuffix(k, "*")
	var b strings.Builder
	b.WriteString("~")
	for _, r := range k {
		if strings.ContainsRune(`*?[]\`, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	if star {
		b.WriteByte('*')
	}
	return b.String()
}
