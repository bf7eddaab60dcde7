package events

import (
	"reflect"
	"strings"
	"testing"
)

func TestParseNamespaces(t *testing.T) {
	cases := []struct {
		list, exclude string
		want          Namespaces
		err           string
	}{
		{"k8s.io", "moby,plugins.moby", Namespaces{Names: []string{"k8s.io"}, Exclude: []string{"moby", "plugins.moby"}}, ""},
		{" default , k8s.io,default", "", Namespaces{Names: []string{"default", "k8s.io"}}, ""},
		{"*", "moby", Namespaces{All: true, Exclude: []string{"moby"}}, ""},
		{"", "", Namespaces{}, "name at least one"},
		{",", "", Namespaces{}, "an empty name between commas"},
		{"k8s.io,,default", "", Namespaces{}, `--namespace "k8s.io,,default": an empty name between commas`},
		{"*,k8s.io", "", Namespaces{}, "* means every namespace and cannot be combined with names"},
		{"k8s.io", "*", Namespaces{}, "--exclude-namespace \"*\": takes names, not *"},
		{"k8s.io,moby", "moby", Namespaces{}, "also in --exclude-namespace"},
		{"bad/ns", "", Namespaces{}, `--namespace "bad/ns"`},
		{"*", "ok,-bad", Namespaces{}, `--exclude-namespace "-bad"`},
		{"a*", "", Namespaces{}, `--namespace "a*"`},
		{"k8s.io,gcagent.lock", "", Namespaces{}, "--namespace gcagent.lock holds the agents' own lock"},
	}
	for _, tc := range cases {
		got, err := ParseNamespaces(tc.list, tc.exclude)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("ParseNamespaces(%q, %q) error %v, want %q", tc.list, tc.exclude, err, tc.err)
			}
			continue
		}
		if err != nil || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("ParseNamespaces(%q, %q) = %+v, %v; want %+v", tc.list, tc.exclude, got, err, tc.want)
		}
	}
}

func TestNamespacesMatch(t *testing.T) {
	all := Namespaces{All: true, Exclude: DefaultExcluded}
	list := Namespaces{Names: []string{"default", "k8s.io"}, Exclude: DefaultExcluded}
	for _, tc := range []struct {
		n    Namespaces
		ns   string
		want bool
	}{
		{all, "k8s.io", true}, {all, "buildkit", true}, {all, "moby", false}, {all, "plugins.moby", false},
		{list, "default", true}, {list, "buildkit", false}, {list, "moby", false},
		{all, AgentNamespace, false}, {Namespaces{All: true}, AgentNamespace, false},
	} {
		if got := tc.n.Match(tc.ns); got != tc.want {
			t.Errorf("%v.Match(%q) = %v, want %v", tc.n, tc.ns, got, tc.want)
		}
	}
}
