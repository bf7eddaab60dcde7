package flagvalue

import (
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
)

// TestValues: each value takes its forms and refuses others with a hint
// of the form wanted, and pflag names the flag around it in one line.
func TestValues(t *testing.T) {
	var (
		d    time.Duration
		p, n int
		b    bool
		s    []string
		size int64
	)
	fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
	Add(fs, Duration{&d}, "d", "")
	Add(fs, Percent{&p}, "p", "")
	Add(fs, Int{&n, "-1 = no limit"}, "n", "")
	Add(fs, Bool{&b}, "b", "")
	Add(fs, Strings{&s}, "s", "")
	Add(fs, Bytes{&size}, "size", "")
	if err := fs.Parse([]string{"--d=90s", "--p", "85%", "--n=-1", "--b", "--s=a", "--s", "b", "--size=256MiB"}); err != nil {
		t.Fatal(err)
	}
	if d != 90*time.Second || p != 85 || n != -1 || !b || strings.Join(s, ",") != "a,b" || size != 256<<20 {
		t.Errorf("parsed d=%s p=%d n=%d b=%v s=%v size=%d", d, p, n, b, s, size)
	}
	if got := (Strings{&s}).GetSlice(); len(got) != 2 || fs.Lookup("size").Value.String() != "256MiB" {
		t.Errorf("read back %v, size %s", got, fs.Lookup("size").Value)
	}
	for _, tc := range []struct{ arg, hint string }{
		{"--d=5", "want a duration with a unit, e.g. 90s, 5m or 2h"},
		{"--p=85x", "want a whole percent from 0 to 100, e.g. 85 or 85%"},
		{"--n=many", "want a whole number (-1 = no limit)"},
		{"--b=maybe", "want true or false"},
		{"--size=256XB", "want a size in bytes, e.g. 268435456, 256MiB or 1GiB"},
		{"--size=9999999TiB", "size too large"},
	} {
		err := fs.Parse([]string{tc.arg})
		name, _, _ := strings.Cut(strings.TrimPrefix(tc.arg, "--"), "=")
		if err == nil || !strings.Contains(err.Error(), tc.hint) || !strings.Contains(err.Error(), `"--`+name+`"`) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: %v, want one line naming --%s with %q", tc.arg, err, name, tc.hint)
		}
	}
}
