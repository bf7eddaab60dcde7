package events

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/core/containers"
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
		{",", "", Namespaces{}, "name at least one"},
		{"k8s.io,moby", "moby", Namespaces{}, "also in --exclude-namespace"},
		{"bad/ns", "", Namespaces{}, `--namespace "bad/ns"`},
		{"*", "ok,-bad", Namespaces{}, `--exclude-namespace "-bad"`},
		{"a*", "", Namespaces{}, `--namespace "a*"`},
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
	} {
		if got := tc.n.Match(tc.ns); got != tc.want {
			t.Errorf("%v.Match(%q) = %v, want %v", tc.n, tc.ns, got, tc.want)
		}
	}
	if got := Filters(all); len(got) != 1 || !strings.Contains(got[0], "namespaces") {
		t.Errorf("Filters(*) = %q: want one filter that includes the namespace topics", got)
	}
	if got := Filters(list); len(got) != 2 || !strings.HasPrefix(got[0], "namespace==default,") {
		t.Errorf("Filters(list) = %q: want one filter per namespace", got)
	}
}

func TestCRILabelsOnlyInCRINamespace(t *testing.T) {
	c := containerFixture(map[string]string{labelCRIKind: "container", labelPodUID: "u", labelPodName: "p", labelContainerName: "c"})
	if ev := containerEventIn(CRINamespace, timeZero, c, nil); ev.CRIKind != "container" || ev.PodUID != "u" {
		t.Errorf("in %s: %+v, want a CRI container of pod u", CRINamespace, ev)
	}
	if ev := containerEventIn("default", timeZero, c, nil); ev.CRIKind != "" || ev.PodUID != "" || ev.ContainerName != "" {
		t.Errorf("in default: %+v, want a plain container (CRI labels copied by a client mean nothing there)", ev)
	}
}

var timeZero time.Time

func containerFixture(labels map[string]string) containers.Container {
	return containers.Container{ID: "c1", Image: "app:1", Labels: labels}
}
