package events

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"
)

// CRINamespace is the namespace containerd's CRI plugin keeps pods, their
// containers and their images in (k3s and RKE2 too). Only there do CRI
// labels mean a CRI container, and only there are images removed through
// CRI.
const CRINamespace = "k8s.io"

// AgentNamespace holds the agents' own lock (one agent per containerd: a
// lease, no image or container): never managed, whatever --namespace says.
const AgentNamespace = "gcagent.lock"

// DefaultExcluded are the namespaces never managed unless listed by name:
// Docker's (moby) and its plugins' keep their own state about their
// containers and images, so nothing outside Docker may delete them.
var DefaultExcluded = []string{"moby", "plugins.moby"}

// Namespaces says which containerd namespaces the agent manages: a list, or
// every namespace (including ones created later) but the excluded ones.
type Namespaces struct {
	All     bool     // every namespace not excluded
	Names   []string // when not All, sorted
	Exclude []string // sorted
}

// ParseNamespaces reads --namespace (comma-separated names, or *) and
// --exclude-namespace (comma-separated names). Every name must be a valid
// containerd namespace; a name both listed and excluded is an error.
func ParseNamespaces(list, exclude string) (Namespaces, error) {
	var n Namespaces
	split := func(flag, v string) ([]string, error) {
		var out []string
		if strings.TrimSpace(v) == "" {
			return nil, nil
		}
		for _, f := range strings.Split(v, ",") {
			f = strings.TrimSpace(f)
			if f == "" {
				return nil, fmt.Errorf("--%s %q: an empty name between commas", flag, v)
			}
			if f == "*" && flag == "namespace" {
				return nil, fmt.Errorf("--namespace %q: * means every namespace and cannot be combined with names", v)
			}
			if f == "*" {
				return nil, fmt.Errorf("--%s %q: takes names, not *", flag, v)
			}
			if err := validIdentifier(f); err != nil {
				return nil, fmt.Errorf("--%s %q: %v", flag, f, err)
			}
			out = append(out, f)
		}
		slices.Sort(out)
		return slices.Compact(out), nil
	}
	var err error
	if n.Exclude, err = split("exclude-namespace", exclude); err != nil {
		return n, err
	}
	if strings.TrimSpace(list) == "*" {
		n.All = true
		return n, nil
	}
	if n.Names, err = split("namespace", list); err != nil {
		return n, err
	}
	if len(n.Names) == 0 {
		return n, fmt.Errorf("--namespace %q: name at least one namespace, or *", list)
	}
	for _, name := range n.Names {
		if slices.Contains(n.Exclude, name) {
			return n, fmt.Errorf("--namespace %s is also in --exclude-namespace", name)
		}
		if name == AgentNamespace {
			return n, fmt.Errorf("--namespace %s holds the agents' own lock, no image or container: it is never managed", name)
		}
	}
	return n, nil
}

// identifierRe and maxIdentifier are containerd's rule for identifiers,
// namespaces included (pkg/identifiers, copied: this package links nothing
// of containerd's).
var identifierRe = regexp.MustCompile(`^[A-Za-z0-9]+(?:[._-](?:[A-Za-z0-9]+))*$`)

const maxIdentifier = 76

// validIdentifier is containerd's identifiers.Validate, with its messages.
func validIdentifier(s string) error {
	switch {
	case s == "":
		return fmt.Errorf("identifier must not be empty: invalid argument")
	case len(s) > maxIdentifier:
		return fmt.Errorf("identifier %q greater than maximum length (%d characters): invalid argument", s, maxIdentifier)
	case !identifierRe.MatchString(s):
		return fmt.Errorf("identifier %q must match %v: invalid argument", s, identifierRe)
	}
	return nil
}

// Match reports whether ns is managed: never AgentNamespace.
func (n Namespaces) Match(ns string) bool {
	if ns == AgentNamespace || slices.Contains(n.Exclude, ns) {
		return false
	}
	return n.All || slices.Contains(n.Names, ns)
}

// String is the flag's spelling: "*" or the names joined by commas.
func (n Namespaces) String() string {
	if n.All {
		return "*"
	}
	return strings.Join(n.Names, ",")
}

// Scoped is an event of one namespace, as the Source emits it: containerd's
// envelopes carry their namespace, and each namespace has its own
// projection.
type Scoped struct {
	Namespace string
	Event     Event
}

// Round ends a listing of every managed namespace: those not in Namespaces
// do not exist (any more). It is not journaled.
type Round struct {
	At         time.Time
	Namespaces []string // sorted
}

// KindRound is a Round's kind; it never reaches a journal.
const KindRound Kind = "round"

func (e Round) Time() time.Time { return e.At }
func (Round) Kind() Kind        { return KindRound }
