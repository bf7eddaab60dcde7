package deploy

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// TestSystemdRecipeInstallsTheStaticBinary: the README's and install.md's
// systemd recipes install the binary `make static` builds (static,
// stripped: the one the image ships and every figure is measured on), and
// the Makefile builds it that way. On d7dd547 they installed `make
// build`'s bin/gcagent, dynamic and 59 MB.
func TestSystemdRecipeInstallsTheStaticBinary(t *testing.T) {
	install := regexp.MustCompile(`install -m 0755 (\S+) /usr/local/bin/gcagent`)
	for _, doc := range []string{"../README.md", "../docs/install.md"} {
		b, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		m := install.FindAllStringSubmatch(string(b), -1)
		if len(m) == 0 {
			t.Errorf("%s installs no binary at /usr/local/bin/gcagent", doc)
		}
		for _, bin := range m {
			if bin[1] != "bin/gcagent-static" {
				t.Errorf("%s installs %s, want bin/gcagent-static (make static)", doc, bin[1])
			}
		}
		if !strings.Contains(string(b), "make static") {
			t.Errorf("%s does not say `make static`", doc)
		}
	}
	b, err := os.ReadFile("../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	rule := regexp.MustCompile(`(?m)^static:.*\n\t(.*)$`).FindStringSubmatch(string(b))
	if rule == nil {
		t.Fatal("the Makefile has no static target")
	}
	for _, want := range []string{"CGO_ENABLED=0", "-trimpath", `-ldflags "-s -w $(LDFLAGS)"`, "-o bin/gcagent-static"} {
		if !strings.Contains(rule[1], want) {
			t.Errorf("make static: %q lacks %s", rule[1], want)
		}
	}
}
