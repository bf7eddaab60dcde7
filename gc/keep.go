package gc

import (
	"fmt"
	"path"
	"strings"

	"github.com/distribution/reference"
)

// Keep patterns (--keep-image, the fleet keep list): which names they
// cover, and how an operator is told.

// ValidKeepPattern checks a keep pattern (--keep-image, the fleet keep
// list): a well-formed path.Match glob.
func ValidKeepPattern(pattern string) error {
	if _, err := path.Match(pattern, ""); err != nil {
		return fmt.Errorf("keep pattern %q: %w", pattern, err)
	}
	return nil
}

// keepMatch reports whether a keep pattern covers an image name
// (KeepCovers).
func keepMatch(pattern, name string) bool {
	if ok, _ := path.Match(pattern, name); ok {
		return true
	}
	if strings.HasPrefix(name, "sha256:") {
		return false // CRI's image id: no reference, no short form
	}
	ref, err := reference.ParseNormalizedNamed(name)
	if err != nil {
		return false
	}
	if ok, _ := path.Match(pattern, reference.FamiliarString(ref)); ok {
		return true
	}
	for _, part := range tagAndDigest(ref) {
		if ok, _ := path.Match(pattern, part.String()); ok {
			return true
		}
		if ok, _ := path.Match(pattern, reference.FamiliarString(part)); ok {
			return true
		}
	}
	repo, ok := repositoryPattern(pattern)
	if !ok {
		return false
	}
	if ok, _ := path.Match(repo, ref.Name()); ok {
		return true
	}
	ok, _ = path.Match(repo, reference.FamiliarName(ref))
	return ok
}

// tagAndDigest splits a name that carries both a tag and a digest
// (nginx:1.25@sha256:...) into its tag reference and its digest
// reference, which patterns are matched against too; nil for any other.
func tagAndDigest(ref reference.Named) []reference.Named {
	tagged, ok := ref.(reference.Tagged)
	digested, ok2 := ref.(reference.Digested)
	if !ok || !ok2 {
		return nil
	}
	repo := reference.TrimNamed(ref)
	byTag, err := reference.WithTag(repo, tagged.Tag())
	if err != nil {
		return nil
	}
	byDigest, err := reference.WithDigest(repo, digested.Digest())
	if err != nil {
		return []reference.Named{byTag}
	}
	return []reference.Named{byTag, byDigest}
}

// KeepCovers reports whether a keep pattern (--keep-image, the fleet keep
// list) keeps an image with this name. A pattern is a path.Match glob (*
// does not cross a /) matched against the name as stored
// (docker.io/library/nginx:1.25) and in its familiar form (nginx:1.25),
// so nginx:* and docker.io/library/nginx:* both keep it. A repository
// pattern, REPO or REPO:* (REPO a glob on the repository, no tag, no
// digest), covers every name of the matching repositories: each tag, and
// each digest reference (REPO@sha256:..., the only name a digest-pinned
// pull gives an image). Any other tag glob (app:1.*) covers tags only: a
// digest reference carries no tag to match. A name with both a tag and a
// digest (app:1.25@sha256:...) is matched by its tag (app:1.25) and by
// its digest (app@sha256:...) too, so a tag pattern covers it.
func KeepCovers(pattern, name string) bool { return keepMatch(pattern, name) }

// repositoryPattern returns the repository glob of a repository pattern
// (REPO or REPO:*), and false for any other pattern: a tag glob other than
// *, a digest, a CRI image id.
func repositoryPattern(pattern string) (string, bool) {
	if strings.HasPrefix(pattern, "sha256:") {
		return "", false
	}
	last := pattern[strings.LastIndexByte(pattern, '/')+1:]
	switch {
	case strings.ContainsRune(last, '@'):
		return "", false
	case !strings.ContainsRune(last, ':'):
		return pattern, true
	case strings.HasSuffix(last, ":*") && strings.Count(last, ":") == 1:
		return strings.TrimSuffix(pattern, ":*"), true
	}
	return "", false
}

// DescribeKeepPattern says in one line what a keep pattern covers
// (KeepCovers), for an operator adding one.
func DescribeKeepPattern(pattern string) string {
	if repo, ok := repositoryPattern(pattern); ok {
		return fmt.Sprintf("every tag of %s and every digest-pinned reference %s@sha256:... (as stored and in short form)", repo, repo)
	}
	last := pattern[strings.LastIndexByte(pattern, '/')+1:]
	switch i := strings.LastIndexByte(last, ':'); {
	case strings.HasPrefix(pattern, "sha256:"):
		return "image ids (sha256:<config digest>) matching " + pattern
	case strings.ContainsRune(last, '@'):
		return "digest references matching " + pattern + " (as stored and in short form)"
	case i >= 0:
		repo := pattern[:len(pattern)-len(last)+i]
		return fmt.Sprintf("tags of %s matching %s (also as %s:TAG@sha256:...), not its digest-pinned references (%s@sha256:..., no tag to match): add %s or %s:* to keep those too",
			repo, last[i+1:], repo, repo, repo, repo)
	}
	return "image names matching " + pattern
}

// FamiliarName is the short form of an image name, as keep patterns also
// match it: nginx:1.25 for docker.io/library/nginx:1.25, the name itself
// when it has no shorter form or is not a reference.
func FamiliarName(name string) string {
	if n, err := reference.ParseNormalizedNamed(name); err == nil {
		return reference.FamiliarString(n)
	}
	return name
}

// DeclaredRule is the rule of an image the cluster keep list keeps: the
// reference and the workloads that declare it.
func DeclaredRule(ref, by string) string {
	if by == "" {
		return "cluster keep list: " + ref
	}
	return "cluster keep list: " + ref + ", declared by " + by
}

// DeclaredMatch reports whether the cluster keep list (exact normalized
// references, KeepList.Declared) holds an image with this name: as stored,
// normalized (nginx:1.25 is docker.io/library/nginx:1.25), and for a name
// with both a tag and a digest, as either; it returns the reference and
// who declares it. CRI's image id (sha256:...) is no reference.
func DeclaredMatch(declared map[string]string, name string) (ref, by string, ok bool) {
	if by, ok := declared[name]; ok {
		return name, by, true
	}
	if strings.HasPrefix(name, "sha256:") {
		return "", "", false
	}
	n, err := reference.ParseNormalizedNamed(name)
	if err != nil {
		return "", "", false
	}
	forms := []reference.Named{n}
	if _, tagged := n.(reference.Tagged); !tagged {
		if _, digested := n.(reference.Digested); !digested {
			forms = append(forms, reference.TagNameOnly(n))
		}
	}
	forms = append(forms, tagAndDigest(n)...)
	for _, f := range forms {
		if by, ok := declared[f.String()]; ok {
			return f.String(), by, true
		}
	}
	return "", "", false
}

// PrefixKeeps reports whether a prefix keep (KeepList.Prefixes) holds an
// image with this name: the name as stored or in its familiar form
// starts with prefix.
func PrefixKeeps(prefix, name string) bool {
	return strings.HasPrefix(name, prefix) || strings.HasPrefix(FamiliarName(name), prefix)
}
