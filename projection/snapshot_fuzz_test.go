package projection

import "testing"

// FuzzSnapshot: arbitrary bytes after the magic decode or fail, never
// panic; what decodes encodes and decodes again.
func FuzzSnapshot(f *testing.F) {
	f.Add(encodeSnapshot(New())[len(snapshotMagic):])
	f.Add(encodeSnapshot(busyNode(3))[len(snapshotMagic):])
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := decodeSnapshot(append(append([]byte(nil), snapshotMagic...), data...))
		if err != nil {
			return
		}
		s.fill()
		if _, err := decodeSnapshot(encodeSnapshot(s)); err != nil {
			t.Fatalf("re-encoded snapshot does not decode: %v", err)
		}
	})
}
