package docs

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode"
)

// markdownFiles are the documents whose links are checked: the README and
// every docs/*.md.
func markdownFiles(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob("*.md")
	if err != nil {
		t.Fatal(err)
	}
	files = append(files, filepath.Join("..", "README.md"))
	if len(files) < 5 {
		t.Fatalf("found only %v", files)
	}
	return files
}

// proseLines are the lines of a Markdown document outside fenced code
// blocks, with inline code spans blanked (a link in code is not a link),
// keyed by line number.
func proseLines(text string) map[int]string {
	out := map[int]string{}
	fence := ""
	codeSpan := regexp.MustCompile("`+[^`]*`+")
	for i, line := range strings.Split(text, "\n") {
		trimmed := strings.TrimSpace(line)
		if fence != "" {
			if strings.HasPrefix(trimmed, fence) {
				fence = ""
			}
			continue
		}
		if strings.HasPrefix(trimmed, "```") || strings.HasPrefix(trimmed, "~~~") {
			fence = trimmed[:3]
			continue
		}
		out[i+1] = codeSpan.ReplaceAllStringFunc(line, func(s string) string {
			return strings.Repeat(" ", len(s))
		})
	}
	return out
}

var (
	headingLine = regexp.MustCompile(`^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$`)
	mdLink      = regexp.MustCompile(`\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^()\s]+)(?:\s+"[^"]*")?\)`)
	inlineLink  = regexp.MustCompile(`\[([^\]]*)\]\([^)]*\)`)
)

// slug is the anchor GitHub gives a heading's text: lower case, the
// inline markup's text only, every character but letters, digits,
// marks, '-', '_' and spaces dropped, spaces made '-'.
func slug(heading string) string {
	heading = inlineLink.ReplaceAllString(heading, "$1")
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r) || unicode.IsMark(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// anchors are the anchors of a Markdown document's headings, as GitHub
// makes them: a repeated slug gets -1, -2, ...
func anchors(text string) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	lines := proseLines(text)
	raw := strings.Split(text, "\n")
	for n := 1; n <= len(raw); n++ {
		if _, prose := lines[n]; !prose {
			continue
		}
		m := headingLine.FindStringSubmatch(raw[n-1])
		if m == nil {
			continue
		}
		s := slug(strings.ReplaceAll(m[2], "`", ""))
		if k := seen[s]; k > 0 {
			out[s+"-"+strconv.Itoa(k)] = true
		} else {
			out[s] = true
		}
		seen[s]++
	}
	return out
}

func TestSlug(t *testing.T) {
	for heading, want := range map[string]string{
		"Footprint at a busy node's size":                "footprint-at-a-busy-nodes-size",
		"Fleet NATS: cluster, leaf nodes, credentials":   "fleet-nats-cluster-leaf-nodes-credentials",
		"kill -9 between a delete and its event":         "kill--9-between-a-delete-and-its-event",
		"Idle at 10,000 under 40 MiB":                    "idle-at-10000-under-40-mib",
		"Deletion orders: LRU and GDSF":                  "deletion-orders-lru-and-gdsf",
		"gcagent replay":                                 "gcagent-replay",
		"State disk full (ENOSPC)":                       "state-disk-full-enospc",
		"The [kubelet](https://kubernetes.io)'s config":  "the-kubelets-config",
		"Wall-clock step of ±1 h, while the agent runs":  "wall-clock-step-of-1-h-while-the-agent-runs",
		"--pod-log-dir missing or empty while CRI runs":  "--pod-log-dir-missing-or-empty-while-cri-runs",
		"image GC: an import → first image deleted, p50": "image-gc-an-import--first-image-deleted-p50",
	} {
		if got := slug(heading); got != want {
			t.Errorf("slug(%q) = %q, want %q", heading, got, want)
		}
	}
	a := anchors("# A\n\n## Same\n\n```sh\n# not a heading\n```\n\n### Same\n\n## `code` head\n")
	for _, want := range []string{"a", "same", "same-1", "code-head"} {
		if !a[want] {
			t.Errorf("anchors: %q missing from %v", want, a)
		}
	}
	if a["not-a-heading"] {
		t.Error("a comment in a code block was taken as a heading")
	}
}

// TestLinks: every relative link of the README and docs/*.md names a file
// or directory that exists, and every #anchor one of that Markdown file's
// headings.
func TestLinks(t *testing.T) {
	texts := map[string]string{}
	read := func(path string) (string, error) {
		path = filepath.Clean(path)
		if s, ok := texts[path]; ok {
			return s, nil
		}
		b, err := os.ReadFile(path)
		texts[path] = string(b)
		return string(b), err
	}
	checked := 0
	for _, file := range markdownFiles(t) {
		text, err := read(file)
		if err != nil {
			t.Fatal(err)
		}
		for n, line := range proseLines(text) {
			for _, m := range mdLink.FindAllStringSubmatch(line, -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				checked++
				path, anchor, _ := strings.Cut(target, "#")
				dest := file
				if path != "" {
					dest = filepath.Join(filepath.Dir(file), path)
					if _, err := os.Stat(dest); err != nil {
						t.Errorf("%s:%d: link %s: %v", file, n, target, err)
						continue
					}
				}
				if anchor == "" {
					continue
				}
				if !strings.HasSuffix(dest, ".md") {
					t.Errorf("%s:%d: link %s: an anchor in a file that is not Markdown", file, n, target)
					continue
				}
				destText, err := read(dest)
				if err != nil {
					t.Errorf("%s:%d: link %s: %v", file, n, target, err)
					continue
				}
				if !anchors(destText)[anchor] {
					t.Errorf("%s:%d: link %s: no heading of %s has the anchor #%s", file, n, target, dest, anchor)
				}
			}
		}
	}
	if checked < 50 {
		t.Fatalf("only %d relative links found: the link pattern no longer matches", checked)
	}
}
