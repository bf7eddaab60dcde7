package node

import "testing"

// FuzzJSONField: for every valid JSON document, scanning for the fields
// finds what a decode of the whole document finds; invalid ones do not
// panic.
func FuzzJSONField(f *testing.F) {
	for _, doc := range jsonFieldSeeds(f) {
		f.Add(doc)
	}
	f.Fuzz(func(t *testing.T, doc []byte) { checkJSONField(t, doc) })
}
