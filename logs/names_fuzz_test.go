package logs

import (
	"strconv"
	"strings"
	"testing"
)

// FuzzNames feeds arbitrary directory entry names (any bytes but '/' and
// NUL can name a file) to the parsers that decide what a name means.
// They must never panic; an id or uid they return must be a suffix of the
// name made of the allowed characters only, so that no crafted name can
// point a decision at another object.
func FuzzNames(f *testing.F) {
	for _, s := range []string{
		"web-0_default_app-0123456789abcdef.log",
		"x_y_z-abc12.log", "a-abcdef.log", ".log", "-.log", "app-abcdef.log.1",
		"default_web-0_5f1c9d2e-7a4b-4c1e-9d3f-0123456789ab",
		"kube-system_static_0123456789abcdef0123456789abcdef",
		"lost+found", "_", "a_", "\xff\xfe_uid", "ns_name_uid\n", "\u200b-abcdef.log",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		if id, ok := ContainerID(name); ok {
			if !strings.HasSuffix(name, "-"+id+".log") && name != id+".log" {
				t.Fatalf("ContainerID(%q) = %q, not the last field", name, id)
			}
			if len(id) < 6 || !isToken(id, false) {
				t.Fatalf("ContainerID(%q) = %q, not a runtime id", name, id)
			}
		}
		if uid, ok := PodUID(name); ok {
			if !strings.HasSuffix(name, uid) || strings.Contains(uid, "_") || !isToken(uid, true) || uid == "" {
				t.Fatalf("PodUID(%q) = %q", name, uid)
			}
		}
		d := display("/var/log/pods", name)
		if !strings.HasPrefix(d, "/var/log/pods/") {
			t.Fatalf("display moved %q out of its dir: %q", name, d)
		}
		if shown := strings.TrimPrefix(d, "/var/log/pods/"); shown != name {
			if back, err := strconv.Unquote(shown); err != nil || back != name {
				t.Fatalf("display(%q) = %q hides bytes", name, d)
			}
		}
	})
}

// FuzzMountinfo feeds arbitrary /proc/self/mountinfo text to the parser
// that protects mounted pod dirs. It must never panic, and every name it
// returns must be one path component (never empty, never holding '/').
func FuzzMountinfo(f *testing.F) {
	f.Add([]byte("36 35 98:0 /mnt1 /var/log/pods/ns_p_uid/vol rw,noatime master:1 - ext3 /dev/root rw\n"), "/var/log/pods")
	f.Add([]byte("1 2 3:4 / /var/log/pods/a\\040b rw - tmpfs t rw\n1 2 3:4 / /var/log/podsX rw\n1 2 3:4 / /var/log/pods/ rw\n"), "/var/log/pods/")
	f.Add([]byte("1 2 3:4 / /\\134\\ rw\n short\n"), "/")
	f.Fuzz(func(t *testing.T, data []byte, dir string) {
		for name := range parseMountinfo(data, dir) {
			if name == "" || strings.Contains(name, "/") {
				t.Fatalf("parseMountinfo(dir %q) gave name %q", dir, name)
			}
		}
		_ = unescapeOctal(string(data))
	})
}
