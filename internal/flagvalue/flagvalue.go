// Package flagvalue holds the values of gcagent's flags (pflag.Value)
// whose errors say what the value should look like: `85%` given where a
// percent is wanted, `5` where a duration is, `many` where a number is.
// pflag wraps each error as `invalid argument "V" for "--flag" flag: HINT`,
// one line that names the flag.
package flagvalue

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"
)

// Duration is a time.Duration: a unit is required (90s, 5m, 2h).
type Duration struct{ P *time.Duration }

func (d Duration) Type() string { return "duration" }

func (d Duration) String() string {
	if d.P == nil {
		return ""
	}
	return d.P.String()
}

func (d Duration) Set(s string) error {
	v, err := time.ParseDuration(strings.TrimSpace(s))
	if err != nil {
		return errors.New("want a duration with a unit, e.g. 90s, 5m or 2h")
	}
	*d.P = v
	return nil
}

// Percent is a whole percent; a trailing % is allowed, as the policy
// prints it (85%). Whether it is in range is the setting's own check.
type Percent struct{ P *int }

func (p Percent) Type() string { return "percent" }

func (p Percent) String() string {
	if p.P == nil {
		return ""
	}
	return strconv.Itoa(*p.P)
}

func (p Percent) Set(s string) error {
	n, err := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(s), "%"))
	if err != nil {
		return errors.New("want a whole percent from 0 to 100, e.g. 85 or 85%")
	}
	*p.P = n
	return nil
}

// Int is a whole number; Hint says what it counts, e.g. "-1 = no limit".
type Int struct {
	P    *int
	Hint string
}

func (i Int) Type() string { return "int" }

func (i Int) String() string {
	if i.P == nil {
		return ""
	}
	return strconv.Itoa(*i.P)
}

func (i Int) Set(s string) error {
	n, err := strconv.Atoi(strings.TrimSpace(s))
	if err != nil {
		if i.Hint != "" {
			return fmt.Errorf("want a whole number (%s)", i.Hint)
		}
		return errors.New("want a whole number, e.g. 5")
	}
	*i.P = n
	return nil
}

// Bool is true or false; given without a value it is true (Add sets
// pflag's NoOptDefVal).
type Bool struct{ P *bool }

func (b Bool) Type() string     { return "bool" }
func (b Bool) IsBoolFlag() bool { return true }

func (b Bool) String() string {
	if b.P == nil {
		return ""
	}
	return strconv.FormatBool(*b.P)
}

func (b Bool) Set(s string) error {
	v, err := strconv.ParseBool(strings.TrimSpace(s))
	if err != nil {
		return errors.New("want true or false (or the flag alone for true)")
	}
	*b.P = v
	return nil
}

// Strings is a repeatable flag: each use adds one value. It is a
// pflag.SliceValue, so that its values can be read back one by one.
type Strings struct{ P *[]string }

func (s Strings) Type() string { return "strings" }

func (s Strings) String() string {
	if s.P == nil {
		return ""
	}
	return strings.Join(*s.P, ",")
}

func (s Strings) Set(v string) error        { *s.P = append(*s.P, v); return nil }
func (s Strings) Append(v string) error     { return s.Set(v) }
func (s Strings) Replace(vs []string) error { *s.P = append([]string(nil), vs...); return nil }
func (s Strings) GetSlice() []string        { return append([]string(nil), *s.P...) }

// Bytes is a size in bytes: a plain number, or one with a unit as the
// README writes them (256MiB, 1GiB, 64MB).
type Bytes struct{ P *int64 }

func (b Bytes) Type() string { return "bytes" }

func (b Bytes) String() string {
	if b.P == nil {
		return ""
	}
	return FormatBytes(*b.P)
}

func (b Bytes) Set(s string) error {
	v, err := ParseBytes(s)
	if err != nil {
		return err
	}
	*b.P = v
	return nil
}

// sizeUnits are the units ParseBytes takes, longest first.
var sizeUnits = []struct {
	suffix string
	mult   int64
}{
	{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40},
	{"Ki", 1 << 10}, {"Mi", 1 << 20}, {"Gi", 1 << 30}, {"Ti", 1 << 40},
	{"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12},
	{"B", 1},
}

// ParseBytes reads a whole number of bytes with an optional unit.
func ParseBytes(s string) (int64, error) {
	s = strings.TrimSpace(s)
	num, mult := s, int64(1)
	for _, u := range sizeUnits {
		if strings.HasSuffix(s, u.suffix) {
			num, mult = strings.TrimSpace(strings.TrimSuffix(s, u.suffix)), u.mult
			break
		}
	}
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil || n < 0 {
		return 0, errors.New("want a size in bytes, e.g. 268435456, 256MiB or 1GiB")
	}
	if n > math.MaxInt64/mult {
		return 0, errors.New("size too large")
	}
	return n * mult, nil
}

// FormatBytes writes n with the largest binary unit that divides it.
func FormatBytes(n int64) string {
	for _, u := range []struct {
		suffix string
		mult   int64
	}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if n != 0 && n%u.mult == 0 {
			return fmt.Sprintf("%d%s", n/u.mult, u.suffix)
		}
	}
	return strconv.FormatInt(n, 10)
}

// Add defines a flag of value v on fs; a Bool flag may then be given
// without a value.
func Add(fs *pflag.FlagSet, v pflag.Value, name, usage string) *pflag.Flag {
	f := fs.VarPF(v, name, "", usage)
	if _, ok := v.(Bool); ok {
		f.NoOptDefVal = "true"
	}
	return f
}
