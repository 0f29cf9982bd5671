package database

import (
	"strings"
	"unicode/utf8"
)

// StorableText returns s as a text column bounded by
// CHECK (length(col) <= n) accepts it: valid UTF-8 (an invalid byte becomes
// U+FFFD, where PostgreSQL would refuse the whole value with SQLSTATE 22021),
// without U+0000 (which text cannot hold), and at most n characters, cut on
// a character's boundary. For text that comes from outside and is recorded
// as it came, a receiver's error or a processor's reason: refusing it would
// lose the record, not the text.
func StorableText(s string, n int) string {
	s = strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", "")
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	i := 0
	for range n {
		_, size := utf8.DecodeRuneInString(s[i:])
		i += size
	}
	return s[:i]
}
