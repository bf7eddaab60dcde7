package node

import (
	"bytes"
	"encoding/json"
	"strings"
)

// jsonField returns the raw value of key in the JSON object doc, found by
// scanning the object's structure without decoding the rest: a CRI
// container's spec is about 10 KiB of JSON (its seccomp profile, mounts,
// environment) of which a listing needs the annotations, and
// encoding/json validates and walks all of it. Keys match as
// encoding/json matches them to a struct field (case-insensitively); raw
// is nil when doc has no such key. ok is false when doc does not scan as
// an object or holds key more than once: then decode it whole, to keep
// encoding/json's answer.
func jsonField(doc []byte, key string) (raw []byte, ok bool) {
	i := skipSpace(doc, 0)
	if i >= len(doc) || doc[i] != '{' {
		return nil, false
	}
	i = skipSpace(doc, i+1)
	if i < len(doc) && doc[i] == '}' {
		return nil, true
	}
	found := false
	for {
		if i >= len(doc) || doc[i] != '"' {
			return nil, false
		}
		end := skipString(doc, i)
		if end < 0 {
			return nil, false
		}
		name := doc[i:end]
		i = skipSpace(doc, end)
		if i >= len(doc) || doc[i] != ':' {
			return nil, false
		}
		start := skipSpace(doc, i+1)
		end = skipValue(doc, start)
		if end < 0 {
			return nil, false
		}
		if keyIs(name, key) {
			if found {
				return nil, false
			}
			raw, found = doc[start:end], true
		}
		i = skipSpace(doc, end)
		switch {
		case i < len(doc) && doc[i] == ',':
			i = skipSpace(doc, i+1)
		case i < len(doc) && doc[i] == '}':
			return raw, true
		default:
			return nil, false
		}
	}
}

// keyIs reports whether the quoted JSON string name is key, as
// encoding/json matches a field name.
func keyIs(name []byte, key string) bool {
	raw := name[1 : len(name)-1]
	if bytes.IndexByte(raw, '\\') < 0 {
		if eq, ascii := asciiEqualFold(raw, key); ascii {
			return eq // without a copy of every key of every spec scanned
		}
		return strings.EqualFold(string(raw), key)
	}
	var s string
	if err := json.Unmarshal(name, &s); err != nil {
		return false
	}
	return strings.EqualFold(s, key)
}

// asciiEqualFold is strings.EqualFold of b and s when both are ASCII
// (ascii true); otherwise ascii is false and eq means nothing.
func asciiEqualFold(b []byte, s string) (eq, ascii bool) {
	eq = len(b) == len(s)
	for i := range max(len(b), len(s)) {
		var c1, c2 byte
		if i < len(b) {
			c1 = b[i]
		}
		if i < len(s) {
			c2 = s[i]
		}
		if c1|c2 >= 0x80 {
			return false, false
		}
		if 'A' <= c1 && c1 <= 'Z' {
			c1 += 'a' - 'A'
		}
		if 'A' <= c2 && c2 <= 'Z' {
			c2 += 'a' - 'A'
		}
		eq = eq && c1 == c2
	}
	return eq, true
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// skipString returns the index after the string starting at b[i] (a
// quote), or -1 if it does not end. It jumps from quote to quote (most of
// a spec is strings): a quote ends the string unless an odd run of
// backslashes escapes it.
func skipString(b []byte, i int) int {
	start := i
	for i++; ; i++ {
		j := bytes.IndexByte(b[i:], '"')
		if j < 0 {
			return -1
		}
		i += j
		k := i - 1
		for k > start && b[k] == '\\' {
			k--
		}
		if (i-1-k)%2 == 0 {
			return i + 1
		}
	}
}

// skipValue returns the index after the value starting at b[i], or -1 if
// it does not scan: strings and nesting are followed, literals and numbers
// taken as they come (the value found is decoded, and so checked, later).
func skipValue(b []byte, i int) int {
	if i >= len(b) {
		return -1
	}
	switch b[i] {
	case '"':
		return skipString(b, i)
	case '{', '[':
		depth := 0
		for ; i < len(b); i++ {
			switch b[i] {
			case '"':
				if i = skipString(b, i); i < 0 {
					return -1
				}
				i--
			case '{', '[':
				depth++
			case '}', ']':
				if depth--; depth == 0 {
					return i + 1
				}
			}
		}
		return -1
	}
	start := i
	for i < len(b) && b[i] != ',' && b[i] != '}' && b[i] != ']' && b[i] != ' ' && b[i] != '\t' && b[i] != '\n' && b[i] != '\r' {
		i++
	}
	if i == start {
		return -1
	}
	return i
}
